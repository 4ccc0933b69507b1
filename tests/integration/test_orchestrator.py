"""The rollout orchestrator's one path in every mode: real SGS instance processes and the trainer.

The features that used to be bounded-only (partial rollout, redundancy, repack) and hardware
affinity without the router run in the lock-step modes too, within the mode's bound."""

from __future__ import annotations

import json

import pytest

from tests.integration.runs import kill_instance_after_first_step, run_smoke


def _run(tmp_path, checkpoint, overrides, on_poll=None):
    return run_smoke(tmp_path, checkpoint, ["generation.instances=2", "generation.dispatch.router='off'", *overrides],
                     on_poll)


def test_one_step_runs_lpt_dispatch_partial_rollout_redundancy_repack_and_survives_a_killed_instance(
        tmp_path, tiny_checkpoint):
    """Every orchestrator mechanism in a lock-step mode at once: the ranker's estimates with LPT
    dispatch over the instances, partial rollout, redundancy, repack; instance 1 is killed after the
    first step: its trajectories resume on instance 0 (the launcher restarts it; it may be back by
    the end). The run's own length estimates ride on the ranker's (``generation.dispatch.run_signals``)."""
    from ranker.base import create
    from ranker.store import RankerStore

    ranker = create("prompt_length").fit(["a", "bbbbbbbb"], [5, 9]).save(tmp_path / "r0")
    RankerStore(tmp_path / "store").publish(ranker)
    eta, killed = 1, []
    summary, rows = _run(
        tmp_path, tiny_checkpoint,
        [f"generation.ranker_dir={tmp_path / 'store'}", "generation.dispatch.policy=lpt",
         "trainer.mode=one_step", "trainer.iterations=6", "trainer.partial_rollout=true",
         "trainer.redundancy_samples=1", "trainer.redundancy_groups=1",
         "trainer.repack.enabled=true", "trainer.repack.interval_s=0.1", "generation.step_delay_ms=[30, 30]",
         "generation.dispatch.run_signals.enabled=true"],
        on_poll=kill_instance_after_first_step(tmp_path, killed, busy=True),  # with trajectories on it
    )
    assert killed, "instance 1 was not found"
    assert [r["iteration"] for r in rows] == list(range(6)) and summary["final_weight_version"] == 6
    for r in rows:
        assert r["eta"] == eta and r["bound_violations"] == 0 and r["staleness_max"] <= eta
        assert r["samples"] == 16  # the batch: redundant groups and samples are surplus, never trained
    last = rows[-1]
    assert last.get("aborted_redundant", 0) >= 1, last  # batch-level redundancy: one surplus group a step
    assert sum(last["instance_groups"]) >= 6 * 4 and min(last["instance_groups"]) > 0
    assert any(r["kv_snapshots"] > 0 for r in rows)  # repack observed the instances (a per-step count)
    assert last["instances_lost"] == 1 and last["recovered"] > 0, last
    assert list(last["instances_alive"].values()) == [True, last.get("instances_readmitted", 0) == 1]
    # every group was placed by the policy on the ranker's estimates
    assert last["dispatch_policy"] == "lpt" and last["estimator_failures"] == 0
    # (groups whose instance is killed between the pick and the launch resume sample by sample elsewhere:
    # estimated, never launched there as groups; one kill here, so at most one round's batch: 4 + 1 redundant)
    launched = sum(last["instance_groups"])
    assert launched > 0 and last["dispatched_groups"] > 0 and 0 <= last["estimated_groups"] - launched <= 5, last
    # the run's own estimates followed every group to its end: closed groups' makespans scored
    assert 0.0 <= last["run_signals_recall_at_20"] <= 1.0 and last["run_signals_sigma"] > 0, last
    # and the run's report shows their recall as the run went
    from flows.report import write_report

    report = write_report(tmp_path).read_text()
    assert "run's own length estimates: recall@20%" in report and (tmp_path / "run_signals.png").stat().st_size > 0


@pytest.mark.long  # `make test-long` (CI runs it; docs/testing.md)
def test_sequential_honours_affinity_and_waits_for_its_pools_instance_to_come_back(tmp_path, tiny_checkpoint):
    """generation.affinity with the trainer dialling the instances: every arith group goes to pool b
    (instance 1). Instance 1 is killed after the first step: pool b's work can only go on once the
    launcher has restarted it and the orchestrator has brought it to the newest weights and
    readmitted it. Sequential (eta 0, training held until the batch is complete) trains on-policy."""
    killed: list[int] = []
    summary, rows = _run(
        tmp_path, tiny_checkpoint,
        ["trainer.mode=sequential", "trainer.iterations=3",
         "generation.pools=[{name: a, instances: [0]}, {name: b, instances: [1]}]", "generation.affinity={arith: b}"],
        on_poll=kill_instance_after_first_step(tmp_path, killed),
    )
    assert killed and summary["final_weight_version"] == 3
    assert all(r["samples"] == 16 and r["staleness_max"] == 0 for r in rows)
    last = rows[-1]
    assert last["instance_groups"] == [0, 3 * 4], last["instance_groups"]
    assert last["instances_lost"] == 1 and last["instances_readmitted"] == 1, last
    assert list(last["instances_alive"].values()) == [True, True]
    services = [json.loads(x) for x in (tmp_path / "recovery" / "services.jsonl").read_text().splitlines()]
    assert [s["service"] for s in services] == ["sgs-1"]


@pytest.mark.long  # `make test-long` (CI runs it; docs/testing.md)
def test_bounded_runs_dispatch_repack_partial_rollout_and_scale_out_together(tmp_path, tiny_checkpoint):
    """Issue 29's combination: bounded mode with the ranker's estimates and LPT dispatch, repack,
    partial rollout and a scale-out event, no router: a slow single instance puts generation
    behind, the controller starts a second one, the orchestrator takes it in through the
    membership file (brought to the newest weights first) and routes to it. Weights go as deltas
    over the network (issue 56): the joining instance holds no version, so it takes its first one
    whole (counted), and every later one as a delta like the first instance."""
    from ranker.base import create
    from ranker.store import RankerStore

    RankerStore(tmp_path / "store").publish(
        create("prompt_length").fit(["a", "bbbbbbbb"], [5, 9]).save(tmp_path / "r0"))
    summary, rows = _run(tmp_path, tiny_checkpoint, [
        # 16 iterations: the added instance's start (a process and a model load) slows with the machine's
        # load while the run's pace is set by step_delay_ms; a busy machine joined it after the last launch
        # with 8, and once with 12 (a fresh-clone make test, 2026-11-29: joined, 0 groups)
        "generation.instances=1", "trainer.mode=bounded", "trainer.eta=2", "trainer.iterations=16",
        f"generation.ranker_dir={tmp_path / 'store'}", "generation.dispatch.policy=lpt",
        "trainer.partial_rollout=true", "trainer.repack.enabled=true", "trainer.repack.interval_s=0.1",
        "generation.step_delay_ms=[40]", "scaleout.enabled=true", "scaleout.max_instances=2", "scaleout.window=1",
        "scaleout.cooldown=1", "scaleout.scale_in=false", "weights.delta=true", "weights.shm=false",
    ])
    assert summary["final_weight_version"] == 16
    assert all(r["bound_violations"] == 0 and r["samples"] == 16 and r["entry_staleness_max"] <= 2 for r in rows)
    events = [json.loads(x) for x in (tmp_path / "scaleout.jsonl").read_text().splitlines()]
    outs = [e for e in events if e["event"] == "scale_out"]
    assert len(outs) == 1 and outs[0]["instances"] == 2, events
    last = rows[-1]
    assert last["instances_joined"] == 1 and len(last["instance_groups"]) == 2 and last["instance_groups"][1] > 0
    assert last["dispatched_groups"] > 0 and last["estimated_groups"] > 0 and any(r["kv_snapshots"] > 0 for r in rows)
    ack = json.loads((tmp_path / "sgs-membership-ack.json").read_text())
    assert ack[outs[0]["address"]]["state"] == "joined"
    _check_join_took_deltas(tmp_path, last)


def _check_join_took_deltas(run_dir, last: dict) -> None:
    """The joined instance (``sgs-1``) took its first version whole, counted as a fallback, and any later
    one as a delta over TCP; the first instance took deltas too."""
    assert last["weights_pushed_delta"] > 0 and last["weights_pulled_fallback"] >= 1, last
    pulls = {name: [line for line in (run_dir / f"{name}.log").read_text().splitlines() if "pulled and staged" in line]
             for name in ("sgs-0", "sgs-1")}
    assert "whole: this instance held no version yet (new or restarted)" in pulls["sgs-1"][0], pulls["sgs-1"]
    assert all("(delta+tcp)" in line for line in pulls["sgs-1"][1:]), pulls["sgs-1"]
    assert any("(delta+tcp)" in line for line in pulls["sgs-0"]), pulls["sgs-0"]
