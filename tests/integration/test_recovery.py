"""Trainer recovery end to end: kill -9 the trainer mid-run; the launcher restarts it, it resumes
from its recovery checkpoint, and the run finishes with every consumed sample consumed once."""

from __future__ import annotations

import json
import time

import psutil
import pytest

from flows.launcher import run_processes
from services.common.config import load_config, write_config
from services.run import recovery
from services.run.ledger import check_ledger, read_records
from tests.conftest import FAST_ENGINE, ROOT
from tests.integration.datasets import dataset_overrides, write_rows


def _learner_pid(run_dir) -> int | None:
    path = run_dir / "learner.pid"
    return int(path.read_text()) if path.exists() else None


def _trainer(run_dir) -> psutil.Process | None:
    """The trainer process (not its learner process, a fork of it with the same command line)."""
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if cmd[1:3] == ["-m", "services.run"] and str(run_dir) in " ".join(cmd) and proc.pid != _learner_pid(run_dir):
            return proc
    return None


class KillAfterCheckpoint:
    """on_poll hook: once a recovery checkpoint exists and the ledger shows a step after it, stop
    the trainer (SIGSTOP: its files are frozen), count the consumed groups the checkpoint does not
    cover (they must roll back), and kill -9 it. Bounded mode takes its steps in bursts (several
    buffers become Ready together) and may checkpoint right after one, so from ``late`` metrics
    rows on it is killed at the next poll whatever it consumed since its checkpoint."""

    def __init__(self, run_dir, late: int | None) -> None:
        self.run_dir = run_dir
        self.late = late if late is not None else 10**9
        self.killed_at: float | None = None
        self.rolled_back = 0

    def _after_checkpoint(self) -> int | None:
        found = recovery.newest(recovery.recovery_dir(self.run_dir))
        if found is None:
            return None
        records, _ = read_records(self.run_dir / "ledger.jsonl")
        return sum(1 for r in records if r["event"] == "consume" and r["step"] > found.version)

    def __call__(self) -> None:
        if self.killed_at is not None:
            return
        rows = len((self.run_dir / "metrics.jsonl").read_text().splitlines())
        if not self._after_checkpoint() and not (rows >= self.late
                                                  and recovery.newest(recovery.recovery_dir(self.run_dir))):
            return
        proc = _trainer(self.run_dir)
        if proc is None:
            return
        proc.suspend()
        rolled_back = self._after_checkpoint()
        if not rolled_back and rows < self.late:  # it checkpointed meanwhile: try again after its next step
            proc.resume()
            return
        proc.kill()
        self.killed_at, self.rolled_back = time.time(), rolled_back


def _launch(tmp_path, checkpoint, cfg, kill) -> tuple[dict, list[dict]]:
    """Run ``cfg`` with the ``kill`` hook polled; (summary, metrics rows)."""
    write_config(cfg, tmp_path / "config.json")
    (tmp_path / "metrics.jsonl").write_text("")
    summary = json.loads(run_processes(tmp_path, str(checkpoint), on_poll=kill, poll_s=0.1).read_text())
    return summary, [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def _run(tmp_path, checkpoint, overrides, iterations: int, every: int, late: int | None = None):
    cfg = load_config(ROOT / "deploy/configs/smoke.yaml", [
        FAST_ENGINE, f"trainer.iterations={iterations}", f"trainer.recovery.every={every}", "trainer.recovery.keep=2",
        "trainer.recovery.max_restarts=1", "eval.prompts=8", *overrides,
    ])
    kill = KillAfterCheckpoint(tmp_path, late)
    summary, rows = _launch(tmp_path, checkpoint, cfg, kill)
    assert kill.killed_at is not None, "the trainer was not killed"
    assert summary["restarts"] == 1 and summary["final_weight_version"] == iterations
    assert [r["iteration"] for r in rows] == list(range(iterations))
    assert [r["weight_version"] for r in rows] == list(range(1, iterations + 1))
    report = check_ledger(tmp_path / "ledger.jsonl", iterations=iterations,
                          groups_per_step=cfg.trainer.prompts_per_iteration)
    assert report.ok, report.to_json()
    assert report.attempts == 2 and report.rolled_back_groups == kill.rolled_back
    assert report.consumed_samples == iterations * cfg.trainer.prompts_per_iteration * cfg.trainer.group_size
    (event,) = summary["recovery_events"]
    recovery_s = event["first_step_at"] - kill.killed_at  # kill -> the first optimizer step after it
    print(f"recovery: kill -> first new step {recovery_s:.2f}s (launcher-measured {event['recovery_s']:.2f}s), "
          f"resumed at v{event['resumed_version']}, {kill.rolled_back} groups rolled back")
    assert 0 < recovery_s < 60 and event["resumed_version"] % every == 0
    assert len(recovery.complete(recovery.recovery_dir(tmp_path))) <= 2  # keep
    return summary, rows, kill


def test_one_step_trainer_killed_mid_run_resumes_and_consumes_every_sample_once(tmp_path, tiny_checkpoint):
    # a dataset task: the restarted trainer continues the file's epoch order from the checkpoint's cursor
    data = tmp_path / "rows.jsonl"
    write_rows(data)
    _, rows, kill = _run(tmp_path, tiny_checkpoint, ["trainer.mode=one_step", "generation.step_delay_ms=[10]",
                                                           *dataset_overrides(data)], iterations=6, every=2)
    # one-step iterations are evenly spaced: the kill comes after a step past the checkpoint
    assert kill.rolled_back > 0
    assert all(r["samples"] == 16 and r["staleness_max"] <= 1 for r in rows)
    # the history that made the final weights drew the stream's first 24 rows, each once: d0 .. d23
    latest: dict[int, tuple[int, list[str]]] = {}
    for r in read_records(tmp_path / "ledger.jsonl")[0]:
        if r["event"] == "consume":
            attempt, ids = latest.get(r["step"], (r["attempt"], []))
            latest[r["step"]] = (r["attempt"], [*ids, r["prompt_id"]] if attempt == r["attempt"] else [r["prompt_id"]])
    assert sorted(i for _, ids in latest.values() for i in ids) == sorted(f"d{i}" for i in range(24))


# one path for every mode: whole groups resume the way test_one_step_trainer_killed_... checks; the
# partial-rollout run adds the partial-response pool's trajectories (restarted from their prompts)
@pytest.mark.long  # `make test-long` (CI runs it; docs/testing.md)
@pytest.mark.parametrize("partial", [True], ids=["partial-rollout"])
def test_bounded_trainer_killed_mid_run_resumes_within_the_bound(tmp_path, tiny_checkpoint, partial):
    _, rows, _ = _run(tmp_path, tiny_checkpoint, [
        "trainer.mode=bounded", "generation.instances=2", "trainer.eta=1", "generation.step_delay_ms=[0, 30]",
        f"trainer.partial_rollout={str(partial).lower()}",
    ], iterations=8, every=3, late=4)
    assert all(r["bound_violations"] == 0 and r["samples"] == 16 and r["entry_staleness_max"] <= 1 for r in rows)
    assert "regenerated_after_restart" in rows[-1]


@pytest.mark.long  # `make test-long` (CI runs it; docs/testing.md)
def test_agentic_trainer_killed_mid_run_resumes_and_consumes_every_group_once(tmp_path, tiny_checkpoint):
    """An agentic run: the restarted trainer resumes from its checkpoint with new environment
    sessions (in-flight trajectories are not kept) and every consumed group is consumed once."""
    _, rows, kill = _run(tmp_path, tiny_checkpoint, [
        "trainer.mode=one_step", "agentic.enabled=true", "agentic.concurrency=16", "agentic.max_turns=4",
        "agentic.latency.kind=fixed", "agentic.latency.mean_s=0.1", "trainer.prompts_per_iteration=2",
        "trainer.group_size=4", "trainer.micro_batch_groups=1",
    # every=3: the kill window is three steps (v4 to v6; a trajectory wave can end two at once)
    ], iterations=6, every=3)
    assert kill.rolled_back > 0
    assert all(r["trajectories"] == 8 and r["bound_violations"] == 0 for r in rows)


class KillLearnerBetweenCheckpoints:
    """on_poll hook: once a metrics row exists past the newest recovery checkpoint (and no newer
    one is due with it), kill -9 the learner process: the steps since the checkpoint are lost
    with it, and must be replayed."""

    def __init__(self, run_dir, every: int) -> None:
        self.run_dir, self.every = run_dir, every
        self.killed_at: float | None = None

    def _between(self) -> bool:
        found = recovery.newest(recovery.recovery_dir(self.run_dir))
        lines = (self.run_dir / "metrics.jsonl").read_text().splitlines()
        version = json.loads(lines[-1])["weight_version"] if lines else 0
        return found is not None and version > found.version and version % self.every != 0

    def __call__(self) -> None:
        if self.killed_at is not None or not self._between():
            return
        proc = psutil.Process(_learner_pid(self.run_dir))
        proc.suspend()
        if not self._between():
            proc.resume()
            return
        proc.kill()
        self.killed_at = time.time()


@pytest.mark.long  # `make test-long` (CI runs it; docs/testing.md)
def test_a_killed_learner_loses_no_trajectory(tmp_path, tiny_checkpoint):
    """The learner runs in a process of its own: killed between two checkpoints, it is replaced,
    replays the steps since the newest, and the orchestrator (which went on routing and
    collecting) loses nothing: one attempt in the ledger, nothing rolled back or regenerated."""
    iterations, every = 6, 3
    cfg = load_config(ROOT / "deploy/configs/smoke.yaml", [
        FAST_ENGINE, f"trainer.iterations={iterations}", f"trainer.recovery.every={every}", "eval.prompts=8",
        "trainer.mode=bounded", "generation.instances=2", "trainer.eta=1", "generation.step_delay_ms=[0, 30]",
        "trainer.partial_rollout=true",
    ])
    kill = KillLearnerBetweenCheckpoints(tmp_path, every)
    summary, rows = _launch(tmp_path, tiny_checkpoint, cfg, kill)
    assert kill.killed_at is not None, "the learner was not killed"
    assert summary["restarts"] == 0 and summary["final_weight_version"] == iterations
    assert [r["weight_version"] for r in rows] == list(range(1, iterations + 1))
    report = check_ledger(tmp_path / "ledger.jsonl", iterations=iterations,
                          groups_per_step=cfg.trainer.prompts_per_iteration)
    assert report.ok and report.attempts == 1 and report.rolled_back_groups == 0, report.to_json()
    assert report.consumed_samples == iterations * cfg.trainer.prompts_per_iteration * cfg.trainer.group_size
    (revival,) = [json.loads(x) for x in (tmp_path / "learner-restarts.jsonl").read_text().splitlines()]
    assert revival["replayed_steps"] >= 1 and revival["died_at"] >= kill.killed_at - 1
    assert revival["rollout"]["tracked_groups"] >= 0
    assert rows[-1]["learner_restarts"] == 1 and not rows[-1].get("regenerated_after_restart")
    assert all(r["bound_violations"] == 0 and r["samples"] == 16 for r in rows)
