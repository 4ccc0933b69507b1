"""bench/dispatch.py's regime selection and ratio records (pure parts)."""

from __future__ import annotations

import pytest

from bench.dispatch import _ratio, pick_regime


def test_ratio_records_median_spread_and_flags_spread_as_large_as_effect():
    r = _ratio([112.0, 120.0, 128.0], [100.0, 100.0, 100.0])
    assert (r["median"] == pytest.approx(1.2)
            and (r["min"], r["max"], r["n"]) == (pytest.approx(1.12), pytest.approx(1.28), 3))
    assert r["spread_as_large_as_effect"] is False
    noisy = _ratio([90.0, 105.0, 120.0], [100.0, 100.0, 100.0])
    assert noisy["spread_as_large_as_effect"] is True


def _point(name, med, lo):
    return {"name": name, "oracle_vs_best_blind": {"median": med, "min": lo}}


def test_pick_regime_prefers_the_largest_oracle_gain_that_wins_on_every_seed():
    pts = [_point("a", 1.5, 0.9), _point("b", 1.3, 1.1), _point("c", 1.2, 1.05)]
    assert pick_regime(pts)["name"] == "b"
    assert pick_regime([_point("a", 1.5, 0.9), _point("d", 0.95, 0.9)])["name"] == "a"  # none wins everywhere


def test_synthetic_estimates_share_one_draw_per_prompt_and_sigma_zero_is_the_truth():
    from bench.dispatch_data import Workload, with_synthetic_estimates

    w = Workload("long-multi", [5] * 6, [10, 10, 10, 400, 400, 400], [1.0] * 6, ["a", "a", "a", "b", "b", "b"],
                 [(1.0, 30.0), (2.0, 50.0)])
    exact = with_synthetic_estimates(w, 0.0, seed=1)
    assert exact.estimates == [10.0, 10.0, 10.0, 400.0, 400.0, 400.0] and [e for e, _ in exact.history] == [30.0, 50.0]
    noisy = with_synthetic_estimates(w, 1.0, seed=1)
    assert (len(set(noisy.estimates[:3])) == 1 and len(set(noisy.estimates[3:])) == 1
            and noisy.estimates != exact.estimates)
    assert noisy.lengths == w.lengths and [a for _, a in noisy.history] == [30.0, 50.0]
    assert with_synthetic_estimates(w, 1.0, seed=1).estimates == noisy.estimates  # seeded
    with pytest.raises(ValueError):
        with_synthetic_estimates(w, -0.1, seed=0)
