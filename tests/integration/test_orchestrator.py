"""The rollout orchestrator's one path in every mode: real SGS instance processes and the trainer.

The features that used to be bounded-only (partial rollout, redundancy, repack) and hardware
affinity without the router run in the lock-step modes too, within the mode's bound."""

from __future__ import annotations

import json

from flows.launcher import run_processes
from services.common.config import load_config, write_config
from tests.conftest import FAST_ENGINE, ROOT


def _run(tmp_path, checkpoint, overrides):
    cfg = load_config(ROOT / "deploy/configs/smoke.yaml",
                      [FAST_ENGINE, "generation.instances=2", "generation.dispatch.router='off'", *overrides])
    write_config(cfg, tmp_path / "config.json")
    (tmp_path / "metrics.jsonl").write_text("")
    summary = json.loads(run_processes(tmp_path, str(checkpoint), poll_s=0.2).read_text())
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return summary, rows


def test_one_step_runs_partial_rollout_redundancy_and_repack(tmp_path, tiny_checkpoint):
    eta = 1
    summary, rows = _run(
        tmp_path, tiny_checkpoint,
        ["trainer.mode=one_step", "trainer.iterations=4", "trainer.partial_rollout=true",
         "trainer.redundancy_samples=1", "trainer.redundancy_groups=1",
         "trainer.repack.enabled=true", "trainer.repack.interval_s=0.1", "generation.step_delay_ms=[0, 30]"],
    )
    assert [r["iteration"] for r in rows] == list(range(4)) and summary["final_weight_version"] == 4
    for r in rows:
        assert r["eta"] == eta and r["bound_violations"] == 0 and r["staleness_max"] <= eta
        assert r["samples"] == 16  # the batch: redundant groups and samples are surplus, never trained
    last = rows[-1]
    assert last.get("aborted_redundant", 0) >= 1, last  # batch-level redundancy: one surplus group a step
    assert sum(last["instance_groups"]) >= 4 * 4 and min(last["instance_groups"]) > 0
    assert last.get("kv_snapshots", 0) > 0  # repack observed the instances


def test_sequential_honours_affinity_without_the_router(tmp_path, tiny_checkpoint):
    """generation.affinity with the trainer dialling the instances: every arith group goes to pool b;
    sequential (eta 0, training held until the batch is complete) trains on-policy."""
    summary, rows = _run(
        tmp_path, tiny_checkpoint,
        ["trainer.mode=sequential", "trainer.iterations=3",
         "generation.pools=[{name: a, instances: [0]}, {name: b, instances: [1]}]", "generation.affinity={arith: b}"],
    )
    assert summary["final_weight_version"] == 3 and all(r["staleness_max"] == 0 for r in rows)
    assert rows[-1]["instance_groups"] == [0, 3 * 4], rows[-1]["instance_groups"]
