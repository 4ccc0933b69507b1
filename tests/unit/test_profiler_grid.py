"""``braid profile``'s grid measurement: repeated passes interleaved, the median of each point kept."""

from __future__ import annotations

import time

import pytest

from allocator.profiler import measure_grid
from services.generation.engine import EngineOutput


class _TimedEngine:
    """Answers every submitted request at the next poll, after the delay scheduled for that
    measurement (keyed by the measurement's tag: point and pass); records the tags in order."""

    def __init__(self, delays: dict[str, float]) -> None:
        self.delays, self.tags, self._pending = delays, [], []

    def submit(self, request_id: str, prompt: list[int], max_new_tokens: int, *, ignore_eos: bool = False) -> None:
        tag = request_id.rsplit("-", 1)[0]
        if not self._pending:
            self.tags.append(tag)
        self._pending.append((request_id, max_new_tokens))

    def poll(self, timeout: float) -> list[EngineOutput]:
        time.sleep(self.delays.get(self.tags[-1], 0.0))
        outs = [EngineOutput(rid, [1] * n, [0.0] * n, "length") for rid, n in self._pending]
        self._pending = []
        return outs


def test_passes_are_interleaved_and_each_point_keeps_its_median():
    # far apart, so a loaded machine's slower sleeps cannot reorder them
    delays = {"m0-r0": 0.6, "m0-r1": 0.01, "m0-r2": 0.2, "m1-r0": 0.01, "m1-r1": 0.6, "m1-r2": 0.2}
    engine = _TimedEngine(delays)
    ms = measure_grid(engine, [(2, 8, 4), (1, 40, 32)], repeats=3)
    assert engine.tags == ["m0-r0", "m1-r0", "m0-r1", "m1-r1", "m0-r2", "m1-r2"]  # pass after pass
    assert [(m.batch_size, m.prompt_tokens, m.length) for m in ms] == [(2, 8, 4), (1, 40, 32)]
    assert all(0.2 <= m.seconds < 0.6 for m in ms)  # the middle one of three


def test_one_pass_is_the_single_measurement_and_zero_is_refused():
    engine = _TimedEngine({})
    (m,) = measure_grid(engine, [(4, 8, 16)])
    assert engine.tags == ["m0-r0"] and m.seconds >= 0
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        measure_grid(engine, [(4, 8, 16)], repeats=0)
