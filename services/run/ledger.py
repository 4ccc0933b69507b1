"""The consumption ledger: which samples trained which version, across trainer restarts.

``run_dir/ledger.jsonl`` is append-only, one JSON object a line, written by the trainer and
fsynced before the optimizer step that uses what it records:

- ``{"event": "start", "attempt": a, "version": v, "time": t}`` — trainer attempt ``a`` (0 =
  the first process, n = the n-th restart) starts from version ``v`` (0, or the recovery
  checkpoint it resumed from). Every ``consume`` line of an earlier attempt with ``step > v``
  is *rolled back*: its optimizer step was lost with the process (the weights went back to
  version ``v``), so it no longer counts as consumed, and its prompts are drawn again.
- ``{"event": "consume", "attempt": a, "step": s, "prompt_id": p, "samples": [i, ...],
  "sample_versions": [w, ...], "time": t}`` — one GRPO group (prompt ``p``, its sample indices
  and the weight version that generated each) consumed by the optimizer step that produces
  version ``s``.

``check_ledger(path)`` replays the file and reports whether every consumed sample was consumed
exactly once in the history that made the final weights: no ``(prompt_id, sample_index)``
twice among the effective (not rolled back) entries, every step 1..N consumed by exactly one
attempt, in order. A line cut short by a kill (the last one, without its newline) is ignored:
its step was never taken. The chaos suite reuses the checker.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path


class LedgerError(ValueError):
    """A ledger that cannot be read: a malformed line before the last one, an unknown event."""


def _repair_tail(path: Path) -> None:
    """Cut a last line a kill left without its newline (it recorded no completed step)."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)
            f.flush()
            os.fsync(f.fileno())


class Ledger:
    """The trainer's writer: one ``start`` line per attempt, ``consume`` lines per step."""

    def __init__(self, path: Path, attempt: int, start_version: int) -> None:
        self.path = path
        self.attempt = attempt
        _repair_tail(path)
        self._f = path.open("a")
        self._write([{"event": "start", "attempt": attempt, "version": start_version, "time": time.time()}])

    def consume(self, step: int, groups: Iterable) -> None:
        """Record the groups (``.samples``: ``SampleRecord``) the step producing ``step`` trains on."""
        now = time.time()
        self._write([
            {"event": "consume", "attempt": self.attempt, "step": step, "prompt_id": g.samples[0].prompt_id,
             "samples": [s.sample_index for s in g.samples], "sample_versions": [s.weight_version for s in g.samples],
             "time": now}
            for g in groups
        ])

    def _write(self, records: list[dict]) -> None:
        self._f.write("".join(json.dumps(r) + "\n" for r in records))
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


@dataclass
class LedgerReport:
    attempts: int = 0
    steps: list[int] = field(default_factory=list)  # effective steps, in order
    consumed_groups: int = 0
    consumed_samples: int = 0
    rolled_back_groups: int = 0
    duplicate_samples: list[tuple[str, int]] = field(default_factory=list)
    missing_steps: list[int] = field(default_factory=list)
    unexpected_steps: list[int] = field(default_factory=list)  # beyond the expected iterations
    split_steps: list[int] = field(default_factory=list)  # effective entries of one step from several attempts
    out_of_order: list[tuple[int, int]] = field(default_factory=list)  # (attempt, step) not following the last
    wrong_group_counts: dict[int, int] = field(default_factory=dict)  # step -> groups, where not as expected
    torn_lines: int = 0

    @property
    def ok(self) -> bool:
        return not (self.duplicate_samples or self.missing_steps or self.unexpected_steps or self.split_steps
                    or self.out_of_order or self.wrong_group_counts)

    def to_json(self) -> dict:
        return {**self.__dict__, "ok": self.ok}


def read_records(path: Path) -> tuple[list[dict], int]:
    """The ledger's records and the number of torn lines ignored (0 or 1: the last)."""
    lines = path.read_text().split("\n")
    torn = 0
    if lines and lines[-1] == "":
        lines.pop()
    elif lines:  # no newline after the last line: a write cut by a kill
        lines.pop()
        torn = 1
    records = []
    for n, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise LedgerError(f"{path}:{n}: not a JSON line ({err}): {line[:80]!r}") from err
    return records, torn


def check_records(records: list[dict], iterations: int | None = None,
                  groups_per_step: int | None = None) -> LedgerReport:
    """Replay ledger records (pure); ``iterations``: the steps the run must have consumed (1..N),
    ``groups_per_step``: the groups each step must consume."""
    report = LedgerReport()
    effective: dict[int, list[dict]] = {}
    last_step: int | None = None
    for r in records:
        event = r.get("event")
        if event == "start":
            report.attempts += 1
            for step in [s for s in effective if s > r["version"]]:
                report.rolled_back_groups += len(effective.pop(step))
            last_step = r["version"]
        elif event == "consume":
            step = r["step"]
            entries = effective.setdefault(step, [])
            if entries and entries[-1]["attempt"] != r["attempt"]:
                report.split_steps.append(step)
            if last_step is not None and step not in (last_step, last_step + 1):
                report.out_of_order.append((r["attempt"], step))
            entries.append(r)
            last_step = step
        else:
            raise LedgerError(f"unknown ledger event {event!r} in {r}")
    seen: Counter[tuple[str, int]] = Counter()
    for step in sorted(effective):
        report.steps.append(step)
        for r in effective[step]:
            report.consumed_groups += 1
            report.consumed_samples += len(r["samples"])
            seen.update((r["prompt_id"], i) for i in r["samples"])
        if groups_per_step is not None and len(effective[step]) != groups_per_step:
            report.wrong_group_counts[step] = len(effective[step])
    report.duplicate_samples = sorted(k for k, n in seen.items() if n > 1)
    top = iterations if iterations is not None else max(effective, default=0)
    report.missing_steps = [s for s in range(1, top + 1) if s not in effective]
    report.unexpected_steps = [s for s in sorted(effective) if s < 1 or s > top]
    return report


def check_ledger(path: str | Path, iterations: int | None = None, groups_per_step: int | None = None) -> LedgerReport:
    """Read ``path`` and check it (``check_records``); the report counts a torn last line."""
    records, torn = read_records(Path(path))
    report = check_records(records, iterations, groups_per_step)
    report.torn_lines = torn
    return report
