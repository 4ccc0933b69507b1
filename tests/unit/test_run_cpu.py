"""A run's CPU between its first and last iteration, per process, and the EMULATED control-plane flag."""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace

from flows.run_cpu import SteadyCpu, control_plane, record_process_cpu


def _row(samples: int, busy: float = 0.1) -> str:
    return json.dumps({"samples": samples, "orchestrator_busy": busy, "orchestrator_tick_cpu_ms_max": 3.0}) + "\n"


def test_steady_cpu_counts_what_ran_between_the_first_and_the_last_iteration(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    me = SimpleNamespace(name="trainer", proc=SimpleNamespace(pid=os.getpid(), poll=lambda: None))
    steady = SteadyCpu(metrics)
    steady.poll([me])  # no file yet: nothing
    metrics.write_text(_row(16))
    steady.poll([me])  # the first iteration ended: the start
    steady.poll([me])  # no new row: nothing
    assert steady.result() is None
    t0 = time.process_time()
    while time.process_time() - t0 < 0.3:  # CPU this process spends between the two iterations
        pass
    with metrics.open("a") as f:
        f.write(_row(16) + _row(16))
    steady.poll([me])
    got = steady.result()
    assert got["samples"] == 32 and got["cpu_s"] >= 0.25 and list(got["by_process"]) == ["trainer"]
    assert abs(got["cpu_s_per_sample"] - got["cpu_s"] / 32) < 1e-12


def test_an_emulated_run_is_flagged_when_its_loop_or_the_machine_set_the_pace(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(_row(8, 0.3) + _row(8, 0.5))
    calm = control_plane(metrics, machine_busy=0.4)
    assert not calm["flagged"] and calm["orchestrator_busy_max"] == 0.5 and calm["why"] == []
    assert control_plane(metrics, machine_busy=0.9)["flagged"]
    metrics.write_text(_row(8, 0.85))
    assert "orchestrator loop was busy 85%" in control_plane(metrics, machine_busy=0.1)["why"][0]
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"trained_samples": 16, "emulated": {}}))
    cores = os.cpu_count() or 1
    record_process_cpu(summary, cpu_s=4.0 * cores, wall_s=4.0)  # every core busy throughout
    done = json.loads(summary.read_text())
    assert done["process_cpu"]["cpu_s_per_sample"] == 0.25 * cores and done["control_plane"]["flagged"]


def test_steady_cpu_follows_a_run_rolled_back_to_its_checkpoint(tmp_path):
    """The resumed trainer replaces metrics.jsonl with the checkpoint's rows, then appends: the reader
    never lands inside a row (the launcher died on a JSONDecodeError here) and counts each kept row once."""
    metrics = tmp_path / "metrics.jsonl"
    me = SimpleNamespace(name="trainer", proc=SimpleNamespace(pid=os.getpid(), poll=lambda: None))
    steady = SteadyCpu(metrics)
    metrics.write_text(_row(16) + _row(16) + _row(16) + '{"samples": 1')  # killed while writing a row
    steady.poll([me])
    tmp = tmp_path / "metrics.jsonl.tmp"
    tmp.write_text(_row(16) + _row(16, busy=0.25) * 3)  # rewound to one row, then more than before appended
    tmp.replace(metrics)
    steady.poll([me])
    assert steady._samples == 64
    metrics.write_text(_row(8))  # shorter in place: read again from the start
    steady.poll([me])
    assert steady._samples == 8
