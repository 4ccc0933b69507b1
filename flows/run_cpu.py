"""What a local run's processes cost in CPU, and whether an EMULATED run's control plane set its pace.

- ``children_cpu_s``: CPU seconds of the launcher's children that ended (``getrusage``): every
  process of a run once it stopped, start-up included.
- ``SteadyCpu``: the run's live processes' CPU (``/proc/<pid>/stat``: user + system, and their
  reaped children's) read on each launcher tick, kept at the first and the last tick on which
  ``metrics.jsonl`` had a new row: the CPU between the first iteration's end and the last's, per
  sample trained in between, without start-up, evaluation or shut-down, and each process's share
  (``by_process``: which one set the pace when the control plane saturates).
- ``record_process_cpu`` adds both to ``summary.json`` (``process_cpu``) and, on an EMULATED run,
  ``control_plane``: the orchestrator loop's share of wall time, and a flag when the loop or the
  machine's cores were at least ``BUSY_FLAG`` busy (the run's modelled figures are then a lower
  bound on the fleet's).
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterable
from pathlib import Path

BUSY_FLAG = 0.8  # a loop or the machine this busy may have set an EMULATED run's pace
_TICK = os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's children that have ended and been waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def proc_cpu_s(pid: int) -> float:
    """CPU seconds of a live process and its reaped children (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return sum(int(x) for x in fields[11:15]) / _TICK  # utime, stime, cutime, cstime


class SteadyCpu:
    """The run's processes' CPU between the first and the last iteration it saw end."""

    def __init__(self, metrics: Path) -> None:
        self.metrics = metrics
        self.offset = 0  # bytes of metrics.jsonl read so far (each tick reads only what was appended)
        self._file: tuple[int, int] | None = None  # (device, inode) of the file read so far
        self.first: tuple[float, float, int] | None = None  # (cpu s, wall s, samples so far)
        self.last: tuple[float, float, int] | None = None
        self._samples = 0
        self._by: tuple[dict[str, float], dict[str, float]] = ({}, {})  # each process's CPU at first, at last

    def poll(self, services: Iterable) -> None:
        rows = self._new_rows()
        if not rows:
            return
        self._samples += sum(int(r.get("samples", 0)) for r in rows)
        by = {s.name: proc_cpu_s(s.proc.pid) for s in services if s.proc.poll() is None}
        point = (sum(by.values()), time.time(), self._samples)
        if self.first is None:
            self.first, self._by = point, (by, by)
        else:
            self.last, self._by = point, (self._by[0], by)

    def _new_rows(self) -> list[dict]:
        """Rows appended since the last tick. A run rolled back to its recovery checkpoint replaces the
        file with its kept rows (services/run/resume.py ``rewind_metrics``): read again from the start,
        and count the samples of the rows kept, never those of the iterations that run again."""
        try:
            f = self.metrics.open("rb")
        except OSError:
            return []
        with f:
            st = os.fstat(f.fileno())
            if (st.st_dev, st.st_ino) != self._file or st.st_size < self.offset:
                self._file, self.offset, self._samples = (st.st_dev, st.st_ino), 0, 0
            f.seek(self.offset)
            data = f.read()
        complete = data[:data.rfind(b"\n") + 1]  # a row being written is read on a later tick
        self.offset += len(complete)
        return [json.loads(x) for x in complete.splitlines() if x.strip()]

    def result(self) -> dict | None:
        if self.first is None or self.last is None or self.last[2] <= self.first[2]:
            return None
        cpu, wall, samples = (b - a for a, b in zip(self.first, self.last, strict=True))
        first, last = self._by
        by = {name: (last[name] - first[name]) / wall for name in last if name in first and wall > 0}
        return {"cpu_s": cpu, "wall_s": wall, "samples": samples, "cpu_s_per_sample": cpu / samples,
                "cores_busy": cpu / wall if wall > 0 else 0.0,
                "by_process": dict(sorted(by.items(), key=lambda kv: -kv[1]))}  # cores each kept busy


def record_process_cpu(summary_path: Path, cpu_s: float, wall_s: float, steady: SteadyCpu | None = None) -> None:
    """Add ``process_cpu`` (and on an EMULATED run ``control_plane``) to the run's summary."""
    if not summary_path.is_file():
        return
    summary = json.loads(summary_path.read_text())
    samples = summary.get("trained_samples") or 0
    cores = os.cpu_count() or 1
    busy = cpu_s / wall_s if wall_s else 0.0
    between = steady.result() if steady is not None else None
    summary["process_cpu"] = {"cpu_s": cpu_s, "wall_s": wall_s, "cores_busy": busy, "cores": cores,
                              "cpu_s_per_sample": cpu_s / samples if samples else None, "samples": samples,
                              "steady": between}
    if "emulated" in summary:  # the machine while the iterations ran, when measured (start-up is not the pace)
        machine = (between["cores_busy"] if between else busy) / cores
        summary["control_plane"] = control_plane(summary_path.parent / "metrics.jsonl", machine)
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")


def control_plane(metrics: Path, machine_busy: float) -> dict:
    """The orchestrator loop's measured share of each iteration's wall time, and whether the control
    plane may have distorted an EMULATED run's figures (``flagged``, with why)."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.is_file() else []
    loop = [r["orchestrator_busy"] for r in rows if "orchestrator_busy" in r]
    ticks = [r["orchestrator_tick_cpu_ms_max"] for r in rows if "orchestrator_tick_cpu_ms_max" in r]
    why = []
    if loop and max(loop) >= BUSY_FLAG:
        why.append(f"the orchestrator loop was busy {max(loop):.0%} of an iteration's wall time")
    if machine_busy >= BUSY_FLAG:
        why.append(f"the run's processes kept {machine_busy:.0%} of the machine's cores busy")
    return {"orchestrator_busy_mean": sum(loop) / len(loop) if loop else None,
            "orchestrator_busy_max": max(loop) if loop else None,
            "orchestrator_tick_cpu_ms_max": max(ticks) if ticks else None,
            "machine_busy": machine_busy, "flagged": bool(why), "why": why}
