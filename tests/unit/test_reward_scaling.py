"""The reward pool's scaling policy (services/reward/scaling.py) on hand-made load samples."""

from __future__ import annotations

import pytest

from services.reward.scaling import LoadSample, ScalingLimits, decide, utilisation, window

LIMITS = ScalingLimits(min_workers=1, max_workers=3, high_utilisation=0.75, low_utilisation=0.25, window_s=2.0,
                       cooldown_s=1.0)


def samples(utils: list[float], workers: int = 1, *, threads: int = 4, dt: float = 0.5, start: float = 0.0,
            queued: int = 0) -> list[LoadSample]:
    """One sample per ``dt`` seconds at the given utilisations (all workers reporting)."""
    return [LoadSample(start + (i + 1) * dt, dt, workers, workers, threads, u * dt * threads * workers, queued)
            for i, u in enumerate(utils)]


def test_grows_under_sustained_load():
    d = decide(samples([0.9] * 4), 1, LIMITS)
    assert d.action == "out" and d.workers == 2 and d.utilisation == pytest.approx(0.9) and "0.90 >= 0.75" in d.reason


def test_a_queue_throughout_the_window_grows_even_below_the_high_mark():
    d = decide(samples([0.6] * 4, queued=3), 1, LIMITS)
    assert d.action == "out" and d.queued and "waited throughout" in d.reason
    gaps = samples([0.6] * 3, queued=3) + samples([0.6], queued=0, start=1.5)  # the queue drained once: no
    assert decide(gaps, 1, LIMITS).action == "hold"


def test_shrinks_when_idle_but_not_into_the_high_mark():
    d = decide(samples([0.1] * 4, workers=3), 3, LIMITS)
    assert d.action == "in" and d.workers == 2 and "0.15 on 2 workers" in d.reason
    tight = ScalingLimits(1, 3, high_utilisation=0.3, low_utilisation=0.25, window_s=2.0, cooldown_s=1.0)
    d = decide(samples([0.2] * 4, workers=2), 2, tight)  # 0.2 x 2 / 1 = 0.4 >= 0.3: removal would trigger growth
    assert d.action == "hold" and "would reach 0.3" in d.reason
    once = samples([0.1] * 3, workers=2) + samples([0.1], workers=2, queued=1, start=1.5)
    assert decide(once, 2, LIMITS).action == "hold"  # a request waited: not idle


def test_respects_min_and_max_workers():
    at_max = decide(samples([1.0] * 4, workers=3), 3, LIMITS)
    assert at_max.action == "hold" and "at max_workers 3" in at_max.reason
    assert decide(samples([0.0] * 4), 1, LIMITS).action == "hold"  # at min_workers
    assert decide([], 5, LIMITS).action == "in" and decide([], 1, ScalingLimits(min_workers=2)).action == "out"


def test_holds_without_a_full_window():
    d = decide(samples([1.0] * 3), 1, LIMITS)  # 1.5 s of 2 s
    assert d.action == "hold" and d.utilisation is None and "warming up: 1.5s/2.0s" in d.reason
    assert decide([], 1, LIMITS).action == "hold"


def test_cooldown_and_only_samples_at_the_current_size_count():
    history = samples([1.0] * 4) + samples([1.0] * 4, workers=2, start=2.0)  # grew to 2 at t = 2.0
    d = decide(history, 2, LIMITS, last_change_s=2.0)  # the samples starting before 3.0 do not count
    assert d.action == "hold" and "1.0s/2.0s" in d.reason
    assert decide(history + samples([1.0] * 2, workers=2, start=4.0), 2, LIMITS, last_change_s=2.0).action == "out"
    d = decide(samples([1.0] * 4, workers=2, start=2.0), 2, LIMITS,
               last_change_s=3.5)  # newest sample ends at 4.0 < 4.5
    assert d.action == "hold" and "cooldown" in d.reason


def test_window_is_the_newest_samples_and_utilisation_weights_by_capacity():
    history = samples([0.0] * 6) + samples([1.0] * 4, start=3.0)  # idle, then busy for the last 2 s
    assert [s.t_s for s in window(history, 1, None, LIMITS)] == [3.5, 4.0, 4.5, 5.0]
    assert decide(history, 1, LIMITS).action == "out"
    uneven = [LoadSample(1.0, 1.0, 2, 2, 4, 8.0, 0), LoadSample(2.0, 1.0, 2, 1, 4, 0.0, 0)]  # one worker did not report
    assert utilisation(uneven) == pytest.approx(8.0 / 12.0)
    assert utilisation([LoadSample(1.0, 1.0, 1, 0, 4, 0.0, 0)]) == 0.0


def test_irregular_poll_intervals_still_fill_the_window():
    history = [LoadSample(0.6 * (i + 1), 0.6, 1, 1, 2, 0.6 * 2 * 0.9, 0) for i in range(4)]
    assert [s.t_s for s in window(history, 1, None, LIMITS)] == pytest.approx([0.6, 1.2, 1.8, 2.4][-4:])
    assert decide(history, 1, LIMITS).action == "out"


def test_limits_are_checked():
    for bad in [dict(min_workers=3, max_workers=2), dict(low_utilisation=0.8),
                dict(window_s=0.0), dict(cooldown_s=-1.0)]:
        with pytest.raises(ValueError):
            ScalingLimits(**bad)
