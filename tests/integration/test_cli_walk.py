"""The four used-by paths, walked from the command line against a real Prefect server in one go, as
README's "From the command line" gives them: the deployments are on the server (`braid server
start`), a smoke run is triggered with `prefect deployment run` and followed with `braid follow`,
the ranker is retrained on that run's own generation log, the allocator plans, and a last run
uses both the plan and the new ranker. Each step's output is checked, not only its exit status."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ranker.store import RankerStore
from tests.conftest import FAST_ENGINE
from tests.integration.prefect_server import AUTH, prefect_server

ROOT = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).parent / "prefect")
SMOKE = "deploy/configs/smoke.yaml"


def _cli(args: list[str], env: dict, timeout: float = 420) -> subprocess.CompletedProcess:
    t0 = time.monotonic()
    out = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    print(f"{time.monotonic() - t0:6.1f} s  {' '.join(Path(a).name if a.startswith('/') else a for a in args[:5])}")  # -s shows them
    return out


def _trigger(env: dict, deployment: str, params: dict) -> str:
    """`prefect deployment run NAME -p key=json ...`; the flow run's id from what it prints."""
    args = [PREFECT, "--no-prompt", "deployment", "run", deployment]
    for key, value in params.items():  # a plain string as README writes it, anything else as JSON
        args += ["-p", f"{key}={value if isinstance(value, str) else json.dumps(value)}"]
    out = _cli(args, env, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    found = re.search(r"UUID:\s*([0-9a-f-]{36})", out.stdout)
    assert found, out.stdout
    return found.group(1)


def _follow(env: dict, run_id: str) -> str:
    """`braid follow RUN_ID`: must end with the run completed (exit 0); its output."""
    out = _cli([sys.executable, "-m", "flows.cli", "follow", run_id, "--interval", "1", "--timeout", "400"], env)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "state: Completed" in out.stdout, out.stdout[-2000:]
    return out.stdout


def _run_dir(followed: str) -> Path:
    found = re.search(r"run directory: (/\S+)", followed)
    assert found, followed[-2000:]
    return Path(found.group(1))


@pytest.fixture(scope="module")
def cli_env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("walk")
    with prefect_server(tmp) as state:
        env = {**os.environ, "PREFECT_API_URL": state["api_url"], "PREFECT_API_AUTH_STRING": AUTH, "COLUMNS": "240"}
        yield env, tmp


def test_deploy_trigger_retrain_plan_and_run_with_both(cli_env):
    env, tmp = cli_env
    listed = _cli([PREFECT, "--no-prompt", "deployment", "ls"], env, timeout=60)
    assert listed.returncode == 0, listed.stderr
    for name in ("rl_training/rl-training", "retrain_ranker/retrain-ranker", "plan_allocation/plan-allocation"):
        assert name in listed.stdout, listed.stdout

    base = [f"runs_dir={tmp / 'runs'}", f"cache_dir={tmp / 'cache'}", FAST_ENGINE]
    genlog = tmp / "generations.sqlite"
    first = _trigger(env, "rl_training/rl-training", {
        "sites": None, "config_path": SMOKE, "overrides": [*base, "run_id=walk-smoke", f"generation.genlog={genlog}"]})
    followed = _follow(env, first)
    run_dir = _run_dir(followed)
    assert run_dir == tmp / "runs" / "walk-smoke"
    assert "iteration 1/" in followed and "report: " in followed
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert rows and genlog.is_file()

    store = tmp / "rankers"
    retrain = _trigger(env, "retrain_ranker/retrain-ranker", {"params": {
        "log_path": str(genlog), "store_root": str(store), "kind": "tfidf_linear", "min_samples": 20}})
    _follow(env, retrain)
    published = RankerStore(store).current()
    assert published is not None, f"nothing published in {store}"
    current = published.name

    plan_file = tmp / "plan.json"
    plan_run = _trigger(env, "plan_allocation/plan-allocation", {"params": {"out": str(plan_file)}})  # this machine
    _follow(env, plan_run)
    plan = json.loads(plan_file.read_text())
    assert plan["model"] == "braid-tiny" and plan["gen_instances"] >= 1

    last = _trigger(env, "rl_training/rl-training", {
        "sites": None, "config_path": SMOKE, "plan": str(plan_file),
        "overrides": [*base, "run_id=walk-planned", f"generation.ranker_dir={store}"]})
    run_dir = _run_dir(_follow(env, last))
    cfg = json.loads((run_dir / "config.json").read_text())
    assert cfg["generation"]["instances"] == plan["gen_instances"]
    assert cfg["generation"]["ranker_dir"] == str(store)
    assert json.loads((run_dir / "allocation_plan.json").read_text()) == plan
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert rows and all(r.get("ranker_version") == current for r in rows), [r.get("ranker_version") for r in rows]
