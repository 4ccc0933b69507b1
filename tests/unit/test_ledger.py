"""The consumption ledger: writer and checker (services/run/ledger.py)."""

from __future__ import annotations

import json

from services.common.types import SampleRecord
from services.run.ledger import Ledger, check_ledger, check_records
from services.trainer.learner import Group


def _group(prompt: str, n: int = 2, version: int = 0) -> Group:
    samples = [SampleRecord(prompt, prompt, i, (1,), (2,), (0.0,), version, "stop", 0.0, 0.0, 0.0) for i in range(n)]
    return Group(samples, [0.0] * n)


def _start(attempt: int, version: int) -> dict:
    return {"event": "start", "attempt": attempt, "version": version}


def _consume(attempt: int, step: int, prompt: str, samples=(0, 1)) -> dict:
    return {"event": "consume", "attempt": attempt, "step": step, "prompt_id": prompt, "samples": list(samples)}


def test_a_clean_run_passes():
    records = [_start(0, 0), _consume(0, 1, "p0"), _consume(0, 1, "p1"), _consume(0, 2, "p2"), _consume(0, 2, "p3")]
    report = check_records(records, iterations=2, groups_per_step=2)
    assert report.ok and report.steps == [1, 2] and report.consumed_samples == 8 and report.attempts == 1


def test_a_duplicate_sample_is_caught():
    records = [_start(0, 0), _consume(0, 1, "p0"), _consume(0, 2, "p0", samples=(1, 2))]
    report = check_records(records, iterations=2)
    assert not report.ok and report.duplicate_samples == [("p0", 1)]


def test_a_gap_and_an_extra_step_are_caught():
    report = check_records([_start(0, 0), _consume(0, 1, "p0"), _consume(0, 3, "p1")], iterations=2)
    assert not report.ok
    assert report.missing_steps == [2] and report.unexpected_steps == [3] and report.out_of_order == [(0, 3)]


def test_steps_after_the_checkpoint_roll_back_on_restart_and_are_consumed_again():
    # attempt 0 consumed steps 1..3 and died; attempt 1 resumed from the checkpoint at version 2
    records = [_start(0, 0), _consume(0, 1, "p0"), _consume(0, 2, "p1"), _consume(0, 3, "p2"),
               _start(1, 2), _consume(1, 3, "p2"), _consume(1, 4, "p3")]
    report = check_records(records, iterations=4, groups_per_step=1)
    assert report.ok and report.rolled_back_groups == 1 and report.steps == [1, 2, 3, 4] and report.attempts == 2


def test_a_step_consumed_again_without_a_rollback_is_caught():
    records = [_start(0, 0), _consume(0, 1, "p0"), _start(1, 1), _consume(1, 2, "p1"), _consume(0, 2, "p2")]
    report = check_records(records, iterations=2)
    assert not report.ok and report.split_steps == [2]


def test_wrong_group_count_is_caught():
    report = check_records([_start(0, 0), _consume(0, 1, "p0")], iterations=1, groups_per_step=2)
    assert not report.ok and report.wrong_group_counts == {1: 1}


def test_the_writer_repairs_a_torn_tail_and_the_checker_reads_it(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path, 0, 0)
    ledger.consume(1, [_group("p0"), _group("p1")])
    ledger.consume(2, [_group("p2")])
    ledger.close()
    with path.open("a") as f:
        f.write('{"event": "consume", "attempt": 0, "st')  # the kill cut this write
    assert check_ledger(path, iterations=2).torn_lines == 1
    ledger = Ledger(path, 1, 1)  # resumed from version 1: step 2 rolls back
    ledger.consume(2, [_group("p2")])
    ledger.close()
    report = check_ledger(path, iterations=2)
    assert report.ok and report.torn_lines == 0 and report.rolled_back_groups == 1 and report.attempts == 2
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[-1]["sample_versions"] == [0, 0] and lines[-2] == {**lines[-2], "event": "start", "version": 1}
