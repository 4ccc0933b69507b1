"""Deployments on a real Prefect server: `braid server start` on a free port (auth on),
deployments from deploy/prefect.yaml, one process worker per site pool; runs are created from a
deployment through the REST API exactly as the UI's Run button does
(POST /deployments/{id}/create_flow_run with the form's parameters).

Where network namespaces can be made (root, iproute2, tbf: ``bench.netns.unavailable_reason``),
the two sites are two namespaces joined by a tbf-shaped veth: each site's worker, and so its flow
runs and services, runs in its own namespace, the site config's hosts are the link's addresses,
TLS is on across the link, and the server listens on a root-namespace address both reach. Elsewhere
the same tests run on loopback and the test that the run crossed namespaces skips with the reason.
The command-line walk of README's "From the command line" runs against the same server.

Adding a deployment to deploy/prefect.yaml means adding its row to SHORT_RUNS (a test fails
until it is there): the parameters a person would enter for a seconds-long run, and the
artifacts the run must publish (rl-training's is the one two-site run, ``TWO_SITE_RUN``, whose
other tests read what it left). Site service flows have no row of their own: rl_training starts
them, and its two-site run covers them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import yaml

from bench.netns import shaped_link, unavailable_reason
from flows.server import api_request, stop_worker
from ranker.store import RankerStore
from services.common.config import load_config
from tests.conftest import FAST_ENGINE
from tests.integration.prefect_server import AUTH, prefect_server

# `make test-long` (CI runs it): too long for the 15-minute fast tier (docs/testing.md)
pytestmark = pytest.mark.long

ROOT = Path(__file__).resolve().parents[2]
PREFECT_FILE = ROOT / "deploy/prefect.yaml"
PREFECT = str(Path(sys.executable).parent / "prefect")
SMOKE = "deploy/configs/smoke.yaml"
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
LORA_RANK = 8  # the two-site run trains an adapter of this rank
LINK_RATE = "1gbit"  # the sites' link where namespaces can be made: shaped, not a bottleneck for the smoke model


@dataclass(frozen=True)
class ShortRun:
    parameters: Callable[[Path], dict]  # tmp dir -> flow parameters for a seconds-long run
    artifacts: tuple[str, ...]  # artifact keys the run must publish


def _smoke_config(tmp: Path, *overrides: str) -> dict:
    return load_config(
        ROOT / "deploy/configs/smoke.yaml",
        [f"runs_dir={tmp / 'runs'}", f"cache_dir={tmp / 'cache'}", FAST_ENGINE, *overrides],
    ).model_dump(mode="json")


def _two_sites(tmp: Path, **extra) -> dict:
    return {"sites_file": str(tmp / "sites.yaml"), "start_timeout_s": 60, "poll_s": 0.5, **extra}


def _tls_sites(tmp: Path) -> str:
    """The sites file with TLS on: the server's own across a shaped link (TLS is on there), else a
    copy with TLS on and certificates made for it."""
    from services.common.certs import make_certs

    sites = yaml.safe_load((tmp / "sites.yaml").read_text())
    if sites.get("tls", {}).get("enabled"):
        return str(tmp / "sites.yaml")
    path = tmp / "sites-tls.yaml"
    if not path.exists():
        sites["tls"] = {"enabled": True, "dir": str(tmp / "certs")}
        path.write_text(yaml.safe_dump(sites))
        make_certs(path)
    return str(path)


# The one two-site run (rl-training's short run): LoRA, and growing forced lengths that make
# generation fall behind, so the controller starts a second SGS unit on the generation site's pool.
TWO_SITE_ITERATIONS = 14
TWO_SITE_RUN = (
    f"trainer.lora.rank={LORA_RANK}", f"trainer.iterations={TWO_SITE_ITERATIONS}", "eval.prompts=4",
    "generation.max_new_tokens=160", "generation.forced_lengths=true", "generation.max_inflight=2",
    "forced_length_ramp.start=24", "forced_length_ramp.per_iteration=8", "generation.dispatch.policy=least_loaded",
    "scaleout.enabled=true", "scaleout.max_instances=2", "scaleout.window=1", "scaleout.cooldown=1",
    "scaleout.scale_in=false",
    # instance 0 only: the run must outlast the unit's start (a flow run on the pool's worker, ~10 s
    # here, more on a busy machine) by enough iterations for the unit to serve some of them
    "generation.step_delay_ms=[3]",
)


def _generation_log(tmp: Path) -> Path:
    """A generation log holding the ranker fixture's prompts as finished samples (lengths as tokens)."""
    from ranker.genlog import GenerationLog, GenRecord

    path = tmp / "generations.sqlite"
    if not path.exists():
        rows = [json.loads(line) for line in (ROOT / "tests/fixtures/ranker_small.jsonl").read_text().splitlines()]
        with GenerationLog(path) as log:
            log.append(GenRecord(r["id"], r["prompt"], r["response_length"], i // 40, 0, 1e9 + i)
                       for i, r in enumerate(rows))
    return path


# deployment name in deploy/prefect.yaml -> its short run (None: started by another flow, not by people)
SHORT_RUNS: dict[str, ShortRun | None] = {
    "rl-training": ShortRun(
        # the two sites over TLS, a LoRA adapter (what crosses each version is the adapter), and
        # generation made to fall behind so that the site scales out (``TWO_SITE_RUN``)
        parameters=lambda tmp: {"config": _smoke_config(tmp, *TWO_SITE_RUN),
                                "sites": _two_sites(tmp, sites_file=_tls_sites(tmp))},
        artifacts=("rl-training-progress", "rl-training-metrics", "rl-training-report"),
    ),
    "retrain-ranker": ShortRun(
        parameters=lambda tmp: {"params": {"log_path": str(_generation_log(tmp)), "store_root": str(tmp / "rankers"),
                                           "kind": "tfidf_linear", "min_samples": 50}},
        artifacts=("ranker-retrain",),
    ),
    "plan-allocation": ShortRun(
        parameters=lambda tmp: {"params": {"cluster_file": str(ROOT / "deploy/clusters/local-cpu.yaml"),
                                           "model": "braid-tiny",
                                           "workload_file": str(ROOT / "deploy/workloads/tiny.yaml"),
                                           "out": str(tmp / "plan.json")}},
        artifacts=("allocation-plan", "allocation-plan-stages"),
    ),
    "gen-site": None,
    "train-site": None,
}


def _deployments() -> list[dict]:
    return yaml.safe_load(PREFECT_FILE.read_text())["deployments"]



@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A Prefect server with auth, the deployments and a worker per site; sites on ports 0. Where
    network namespaces can be made (``bench/netns.py``), each site's worker runs in a namespace of
    its own and the sites reach each other only across a tbf-shaped link, over TLS (``link`` in the
    state); elsewhere everything runs on loopback (``link`` None)."""
    tmp = tmp_path_factory.mktemp("server")
    with contextlib.ExitStack() as stack:
        link = None if unavailable_reason() else stack.enter_context(shaped_link(LINK_RATE))
        state = stack.enter_context(prefect_server(tmp, link))
        yield {**state, "link": link}, tmp


def _api(state: dict, method: str, path: str, body: dict | None = None, auth: str | None = AUTH):
    return api_request(state["api_url"], method, path, body, auth=auth)


def _deployment_id(state: dict, name: str) -> str:
    status, found = _api(state, "POST", "/deployments/filter", {"deployments": {"name": {"any_": [name]}}})
    assert status == 200 and len(found) == 1, (status, found)
    return found[0]["id"]


def _run_from_deployment(state: dict, name: str, parameters: dict) -> tuple[int, dict]:
    """What the UI's Run button does: create a flow run from the deployment with the form's values."""
    return _api(state, "POST", f"/deployments/{_deployment_id(state, name)}/create_flow_run",
                {"parameters": parameters})


def _wait_final(state: dict, flow_run_id: str, timeout_s: float = 480) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _, run = _api(state, "GET", f"/flow_runs/{flow_run_id}")
        if run["state"]["type"] in FINAL:
            return run
        time.sleep(1.0)
    raise AssertionError(f"flow run {flow_run_id} not final after {timeout_s}s: {run['state']}")


def _artifact_keys(state: dict, flow_run_id: str) -> set[str]:
    _, found = _api(state, "POST", "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}})
    return {a["key"] for a in found}


def test_every_deployment_has_a_short_run_row():
    names = [d["name"] for d in _deployments()]
    assert len(names) == len(set(names)), names
    assert sorted(names) == sorted(SHORT_RUNS), "add the new deployment's row to SHORT_RUNS"


def test_a_client_without_the_auth_string_is_refused(server):
    state, _ = server
    status, body = _api(state, "POST", "/deployments/filter", {}, auth=None)
    assert status == 401, body
    status, _ = _api(state, "POST", "/deployments/filter", {}, auth="braid:wrong")
    assert status == 401
    assert _api(state, "POST", "/deployments/filter", {})[0] == 200


def test_out_of_range_parameter_is_refused_before_a_run_exists(server):
    state, tmp = server
    config = _smoke_config(tmp)
    config["trainer"]["iterations"] = 0
    status, body = _run_from_deployment(state, "rl-training", {"config": config, "sites": _two_sites(tmp)})
    assert status == 409, body
    assert "config.trainer.iterations" in body["detail"] and "minimum of 1" in body["detail"], body
    dep = _deployment_id(state, "rl-training")
    _, runs = _api(state, "POST", "/flow_runs/filter", {"flow_runs": {"deployment_id": {"any_": [dep]}}})
    assert all(r["parameters"]["config"]["trainer"]["iterations"] != 0 for r in runs)


@pytest.mark.parametrize("name", [d["name"] for d in _deployments() if SHORT_RUNS.get(d["name"])])
def test_deployment_run_from_the_api_completes_with_its_artifacts(server, name):
    state, tmp = server
    short = SHORT_RUNS[name]
    status, created = _run_from_deployment(state, name, short.parameters(tmp))
    assert status == 201, created
    run = _wait_final(state, created["id"])
    assert run["state"]["type"] == "COMPLETED", run["state"]["message"]
    assert set(short.artifacts) <= _artifact_keys(state, created["id"])


def test_two_site_run_ran_each_site_on_its_own_pool(server):
    state, _ = server
    by_flow = {}
    for flow_name in ("generation_site", "training_site"):
        _, runs = _api(state, "POST", "/flow_runs/filter", {"flows": {"name": {"any_": [flow_name]}}})
        assert runs, flow_name
        by_flow[flow_name] = runs[0]
    pools = {f: r["work_pool_name"] for f, r in by_flow.items()}
    assert pools == {"generation_site": "braid-generation", "training_site": "braid-training"}
    assert all(r["state"]["type"] == "COMPLETED" for r in by_flow.values())
    assert "sgs-endpoints" in _artifact_keys(state, by_flow["generation_site"]["id"])


def test_two_site_weights_cross_once_through_each_sites_relay(server):
    """Relay transport: the trainer pushed to its site's master relay, the master forwarded every
    version to the generation site's relay, and the SGS pulled it from there; the run trains a LoRA
    adapter, so every version that crossed is the adapter's bytes."""
    _, tmp = server
    logs = {name: sorted((tmp / "runs").glob(f"*/{name}.log"))
            for name in ("relay-train-site", "relay-gen-site", "sgs-0")}
    assert all(logs.values()), logs
    committed = {name: logs[name][-1].read_text().count("committed") for name in ("relay-train-site", "relay-gen-site")}
    assert (committed["relay-train-site"] >= 1
            and committed["relay-gen-site"] == committed["relay-train-site"]), committed
    assert "from relay" in logs["sgs-0"][-1].read_text()
    sizes = {int(line.split("(")[-1].split()[0]) for line in logs["relay-gen-site"][-1].read_text().splitlines()
             if "committed (" in line}
    assert sizes == {_adapter_bytes(tmp)}, sizes  # each version that crossed was the adapter, not the model


def test_two_site_run_crossed_the_shaped_link_between_namespaces(server):
    """Each site's worker (and so its flow runs and services) ran in its own network namespace, the
    generation site served at its address on the link, and every weight version the generation
    site's relay committed went through the training end's tbf (skipped, with the harness's
    reason, where namespaces cannot be made: the run was on loopback)."""
    state, tmp = server
    link = state["link"]
    if link is None:
        pytest.skip(f"the two-site run was on loopback: {unavailable_reason()}")
    for worker in state["workers"]:
        role = "train" if worker["site"] == "train-site" else "gen"
        assert link.identify(worker["pid"]) == link.names[role], worker
    _, runs = _api(state, "POST", "/flow_runs/filter", {"flows": {"name": {"any_": ["generation_site"]}}})
    _, found = _api(state, "POST", "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [runs[-1]["id"]]},
                                                                       "key": {"any_": ["sgs-endpoints"]}}})
    rows = json.loads(found[0]["data"])
    assert rows and all(r["address"].startswith(f"{link.address('gen')}:") for r in rows), rows
    logs = sorted((tmp / "runs").glob("*/relay-gen-site.log"))
    committed = [int(line.split("(")[-1].split()[0]) for log in logs for line in log.read_text().splitlines()
                 if "committed (" in line]
    assert committed and link.tx_bytes("train") >= sum(committed), (committed, link.tx_bytes("train"))


def _adapter_bytes(tmp: Path) -> int:
    """Bytes of the two-site run's adapter (``LORA_RANK``) on its warm-started smoke model."""
    from services.common.lora import adapter_specs
    from services.common.lora_config import LoraConfig

    [checkpoint] = [p for p in (tmp / "cache").glob("warmstart-*") if (p / "warmstart.json").is_file()]
    return sum(s.nbytes for s in adapter_specs(checkpoint, LoraConfig(rank=LORA_RANK)).values())


def test_two_site_scale_out_adds_a_unit_on_the_generation_pool(server):
    """The two-site run (``TWO_SITE_RUN``): growing forced lengths make generation fall behind, the
    controller starts one more SGS instance as a flow run of the generation site's deployment (unit
    1, on its work pool), the site's router takes it in at the current weight version, it serves
    samples, nothing is lost, and the unit stops with the run. TLS is on: the trainer and the
    controller reach the router, and the master relay the site's relay, over mutual TLS."""
    state, tmp = server
    (run_dir,) = [p.parent for p in (tmp / "runs").glob("*/scaleout.jsonl")]
    assert "mutual TLS" in (run_dir / "router.log").read_text()
    events = [json.loads(x) for x in (run_dir / "scaleout.jsonl").read_text().splitlines()]
    (out,) = [e for e in events if e["event"] == "scale_out"]
    assert out["site"] == "gen-site" and out["unit"] == 1 and out["instances"] == 2, out
    _, units = _api(state, "POST", "/flow_runs/filter", {"flow_runs": {"name": {"any_": [out["flow_run"]]}}})
    (unit,) = units
    assert unit["parameters"]["unit"] == 1 and unit["work_pool_name"] == "braid-generation", unit
    assert unit["parent_task_run_id"], "the unit is a subflow of the controller's run"
    assert unit["state"]["type"] == "COMPLETED", unit["state"]

    router = [json.loads(x) for x in (run_dir / "router-timeline.jsonl").read_text().splitlines()]
    (added,) = [e for e in router if e["event"] == "add_instance"]
    assert added["address"] == out["address"]
    assert any(e["event"] == "sample" and e["instance"] == added["slot"] for e in router)  # it served prompts
    assert "from relay" in (run_dir / "sgs-1.log").read_text()  # it pulled weights from the site's relay
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["samples"] for r in rows] == [16] * TWO_SITE_ITERATIONS  # none lost or duplicated


# ---------------------------------------------------------------- the command-line walk
def _cli(args: list[str], env: dict, timeout: float = 420) -> subprocess.CompletedProcess:
    t0 = time.monotonic()
    out = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    # -s shows them
    print(f"{time.monotonic() - t0:6.1f} s  {' '.join(Path(a).name if a.startswith('/') else a for a in args[:5])}")
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


def test_deploy_trigger_retrain_plan_and_run_with_both(server):
    """The four used-by paths walked from the command line, as README's "From the command line" gives
    them: the deployments are on the server, a smoke run is triggered with `prefect deployment run`
    and followed with `braid follow`, the ranker is retrained on that run's own generation log, the
    allocator plans, and a last run uses both the plan and the new ranker. Each step's output is
    checked, not only its exit status. (On this module's server: with a shaped link, the runs start
    on the sites' workers in their namespaces, as any run from a deployment does.)"""
    state, root = server
    env = {**os.environ, "PREFECT_API_URL": state["api_url"], "PREFECT_API_AUTH_STRING": AUTH, "COLUMNS": "240"}
    tmp = root / "walk"
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


@pytest.mark.slow
def test_cross_field_config_error_fails_the_run_before_it_starts(server):
    state, tmp = server
    config = _smoke_config(tmp)
    config["trainer"]["micro_batch_groups"] = 16  # > prompts_per_iteration (4): a validator, not a bound
    status, created = _run_from_deployment(state, "rl-training", {"config": config})
    assert status == 201, created
    run = _wait_final(state, created["id"], timeout_s=180)
    assert run["state"]["type"] == "FAILED" and "micro_batch_groups" in run["state"]["message"], run["state"]
    _, tasks = _api(state, "POST", "/task_runs/filter", {"flow_runs": {"id": {"any_": [created["id"]]}}})
    assert not tasks  # nothing ran


def _kill_sgs_when_serving(run_dir_root: Path, timeout_s: float = 240) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for proc in psutil.process_iter(["pid", "cmdline"]):
            cmd = " ".join(proc.info["cmdline"] or [])
            if "services.generation" in cmd and str(run_dir_root) in cmd and list(run_dir_root.glob("*/sgs-0.port")):
                proc.kill()
                return proc.info["pid"]
        time.sleep(0.5)
    raise AssertionError("no SGS process of the run appeared")


@pytest.mark.slow
def test_a_dead_site_service_fails_the_run_with_its_log_tail(server):
    state, tmp = server
    runs = tmp / "dying"
    config = _smoke_config(tmp, f"runs_dir={runs}", "generation.step_delay_ms=[200]", "trainer.iterations=50")
    status, created = _run_from_deployment(state, "rl-training", {"config": config, "sites": _two_sites(tmp)})
    assert status == 201, created
    _kill_sgs_when_serving(runs)
    run = _wait_final(state, created["id"])
    message = run["state"]["message"]
    assert run["state"]["type"] == "FAILED", message
    assert "generation site 'gen-site'" in message and "sgs-0 exited" in message, message


@pytest.mark.slow
def test_a_site_without_a_worker_fails_naming_its_pool(server):
    """Last in the module: it stops the generation site's worker."""
    state, tmp = server
    assert stop_worker(state["state_dir"], "gen-site")
    params = {"config": _smoke_config(tmp), "sites": _two_sites(tmp, start_timeout_s=10)}
    status, created = _run_from_deployment(state, "rl-training", params)
    assert status == 201, created
    run = _wait_final(state, created["id"], timeout_s=300)
    message = run["state"]["message"]
    assert run["state"]["type"] == "FAILED", message
    assert "work pool 'braid-generation'" in message and "prefect worker start --pool braid-generation" in message
