"""bench/dispatch.py's regime selection and ratio records (pure parts)."""

from __future__ import annotations

import pytest

from bench.dispatch import _ratio, pick_regime


def test_ratio_records_median_spread_and_flags_spread_as_large_as_effect():
    r = _ratio([112.0, 120.0, 128.0], [100.0, 100.0, 100.0])
    assert r["median"] == pytest.approx(1.2) and (r["min"], r["max"], r["n"]) == (pytest.approx(1.12), pytest.approx(1.28), 3)
    assert r["spread_as_large_as_effect"] is False
    noisy = _ratio([90.0, 105.0, 120.0], [100.0, 100.0, 100.0])
    assert noisy["spread_as_large_as_effect"] is True


def _point(name, med, lo):
    return {"name": name, "oracle_vs_best_blind": {"median": med, "min": lo}}


def test_pick_regime_prefers_the_largest_oracle_gain_that_wins_on_every_seed():
    pts = [_point("a", 1.5, 0.9), _point("b", 1.3, 1.1), _point("c", 1.2, 1.05)]
    assert pick_regime(pts)["name"] == "b"
    assert pick_regime([_point("a", 1.5, 0.9), _point("d", 0.95, 0.9)])["name"] == "a"  # none wins everywhere
