"""Your data, your reward: a run trains from a JSONL file with a reward function given by import path.

Real processes (SGS, relay, reward worker, trainer): the prompts come from the file through the
dataset loader (field mapping, held-out split, cursor), every reward is computed by the user's
function inside the reward worker, and a function that raises on some rows costs exactly those
samples (counted, logged, reward 0) and never the run.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from flows.launcher import run_processes
from flows.registries import check_run
from services.common.config import load_config, write_config
from services.run.ledger import check_ledger
from services.tasks.source import build_task
from tests.conftest import FAST_ENGINE, ROOT
from tests.integration.datasets import dataset_overrides, write_rows


# make test-long (CI runs it; docs/testing.md): the fast tier trains from the same JSONL file with the same
# user reward in test_recovery.py's one-step trainer kill, and refuses bad rows and broken functions below
@pytest.mark.long
def test_a_jsonl_dataset_trains_with_a_user_reward_and_counts_its_failures(tmp_path, tiny_checkpoint):
    data = tmp_path / "rows.jsonl"
    write_rows(data)
    cfg = check_run(load_config(ROOT / "deploy/configs/smoke.yaml", [FAST_ENGINE, *dataset_overrides(data)]))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_config(cfg, run_dir / "config.json")
    (run_dir / "metrics.jsonl").write_text("")
    summary = json.loads(run_processes(run_dir, str(tiny_checkpoint)).read_text())
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    tc = cfg.trainer

    # the prompts the trainer drew and evaluated are the loader's: replay the task source
    task = build_task(cfg.task, cfg.eval)
    drawn = task.sampler.batch(tc.iterations * tc.prompts_per_iteration)
    boom = {i.prompt_id for i in drawn + task.eval_set if json.loads(i.row_json)["boom"]}
    failures = [json.loads(x) for x in (run_dir / "reward-failures.jsonl").read_text().splitlines()]
    assert all(f["code"] == "INTERNAL" and "ValueError: boom" in f["message"] for f in failures)
    assert {f["request"].split("/")[0] for f in failures} == boom  # exactly the marked rows' samples failed
    n_train = sum(tc.group_size for i in drawn if i.prompt_id in boom)
    n_eval = sum(1 for i in task.eval_set if i.prompt_id in boom)
    assert len(failures) == n_train + 2 * n_eval == summary["reward_failures"]
    assert sum(r["reward_failures"] for r in rows) == n_train
    assert summary["eval_warmstart"]["reward_failures"] == summary["eval_final"]["reward_failures"] == n_eval

    # every other sample's reward is the user function's value: its visible length in thousandths (at most
    # one character per generated token for the tiny model: its 4 special tokens, EOS among them, decode to
    # nothing), and it reaches training: the scored samples' rewards are not all zero
    for r in rows:
        assert r["reward_mean"] * r["samples"] * 1000 <= sum(r["response_lens"]) + 1e-6
        assert r["samples"] == r["reward_failures"] or r["reward_mean"] > 0
    assert ([r["iteration"] for r in rows] == list(range(tc.iterations))
            and summary["final_weight_version"] == tc.iterations)
    assert check_ledger(run_dir / "ledger.jsonl", tc.iterations, tc.prompts_per_iteration).ok


def test_a_bad_row_is_refused_before_the_run_naming_file_line_and_field(tmp_path):
    data = tmp_path / "rows.jsonl"
    write_rows(data, 10)
    lines = data.read_text().splitlines()
    lines[6] = json.dumps({"q": "", "a": 3})
    data.write_text("\n".join(lines) + "\n")
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "config",
                           "--config", str(ROOT / "deploy/configs/smoke.yaml"),
                           *[x for o in dataset_overrides(data) for x in ("--set", o)]],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{data}:7" in proc.stderr and "prompt field 'q'" in proc.stderr and "Traceback" not in proc.stderr


def test_a_reward_worker_with_a_broken_function_refuses_to_start(tmp_path):
    data = tmp_path / "rows.jsonl"
    write_rows(data, 10)
    overrides = [*dataset_overrides(data), "reward.terms=[{fn: 'length_reward:no_such_function'}]"]
    proc = subprocess.run([sys.executable, "-m", "services.reward", "--config", str(ROOT / "deploy/configs/smoke.yaml"),
                           *[x for o in overrides for x in ("--set", o)]],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "length_reward:no_such_function" in proc.stderr and "length_and_suffix" in proc.stderr
