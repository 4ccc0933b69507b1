"""The flow's progress reader sees only complete metrics rows while the trainer appends one."""

from __future__ import annotations

import json

from flows.artifacts import read_metrics


def test_a_row_still_being_written_is_not_read(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert read_metrics(path) == []
    row = json.dumps({"iteration": 0, "reward": 0.5})
    path.write_text(row + "\n" + row[:20])  # the second row is half on disk
    assert read_metrics(path) == [{"iteration": 0, "reward": 0.5}]
    path.write_text(row + "\n" + row + "\n")
    assert len(read_metrics(path)) == 2
