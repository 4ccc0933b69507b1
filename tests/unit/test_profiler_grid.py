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


def test_the_fit_keeps_each_batchs_own_latency_out_of_the_step_cost():
    """A batch's submission and the poll that sees it end cost once per measurement: fitted apart
    (``per_batch``), they no longer inflate every step (short batches made the step 30% dearer here)."""
    from allocator.profiler import DEFAULT_BATCHES, DEFAULT_LENGTHS, Measurement, fit_step_cost

    k4, k3, per_seq, per_batch = 0.008, 0.0002, 0.0007, 0.012

    def seconds(bs: int, n: int) -> float:
        return n * (max(k3, k3 * bs) + k4) + per_seq * bs + per_batch

    ms = [Measurement(bs, 8, n, seconds(bs, n)) for n in DEFAULT_LENGTHS for bs in DEFAULT_BATCHES]
    coef, err = fit_step_cost(ms)
    assert err < 1e-3
    assert coef["per_batch"] == pytest.approx(per_batch, rel=0.02)
    assert coef["k4"] == pytest.approx(k4, rel=0.02)
    # the prompts are all 8 tokens long: what a sequence costs is shared between its two terms
    assert coef["prefill_per_token"] * 8 + coef["per_sequence"] == pytest.approx(per_seq, rel=0.05)
