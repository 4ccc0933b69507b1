"""The convergence test of bench/e2e.py: paired differences, non-inferiority, negative control."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import e2e_stats as st


def test_paired_difference_cancels_prompt_difficulty():
    rng = random.Random(0)
    difficulty = [rng.random() for _ in range(400)]  # per-prompt accuracy varies widely
    b = difficulty
    a = [min(1.0, x + 0.05) for x in difficulty]
    p = st.paired(a, b)
    assert p["diff"] == pytest.approx(statistics_mean([x - y for x, y in zip(a, b, strict=True)]))
    assert p["se"] < 0.01  # the unpaired standard error would be ~0.02
    assert p["ci95"][0] < p["diff"] < p["ci95"][1]
    assert p["ci95"][1] - p["ci95"][0] == pytest.approx(2 * st.Z95 * p["se"])


def statistics_mean(xs):
    return sum(xs) / len(xs)


def test_paired_rejects_unequal_or_tiny_samples():
    with pytest.raises(ValueError, match="length"):
        st.paired([0.1, 0.2], [0.1])
    with pytest.raises(ValueError, match="two"):
        st.paired([0.1], [0.2])


@pytest.mark.parametrize(("ci", "verdict"), [
    ((-0.005, 0.01), "non-inferior"),   # lower end above -margin (0.01)
    ((-0.03, -0.015), "inferior"),      # upper end below -margin
    ((-0.02, 0.0), "inconclusive"),     # straddles -margin
    ((-0.01, 0.01), "inconclusive"),    # touching -margin is not above it
])
def test_verdict(ci, verdict):
    assert st.verdict(list(ci), 0.01) == verdict


def test_verdict_without_a_gain_is_never_a_pass():
    assert st.verdict([0.0, 0.1], None).startswith("no margin")
    assert st.verdict([0.0, 0.1], 0.0).startswith("no margin")


def _scores(n: int, acc: list[float], seed: int, k: int = 4) -> list[float]:
    """Per-prompt mean of k Bernoulli draws at per-prompt accuracy ``acc``."""
    rng = random.Random(seed)
    return [sum(rng.random() < p for _ in range(k)) / k for p in acc[:n]]


def test_convergence_flags_the_untrained_policy_and_passes_a_matching_mode():
    rng = random.Random(1)
    n = 3000
    base = [rng.betavariate(1.0, 1.5) for _ in range(n)]
    warm = _scores(n, base, 2)
    trained = [min(1.0, p + 0.08) for p in base]
    sync, same = _scores(n, trained, 3), _scores(n, trained, 4)
    worse = _scores(n, [max(0.0, p - 0.06) for p in trained], 5)  # lost 75% of the gain
    out = st.convergence(warm, sync, {"one_step": same, "bounded_9": worse}, {st.UNTRAINED: warm})
    assert out["powered"] and out["sync_gain_se"] >= st.MIN_GAIN_SE
    assert out["margin"] == pytest.approx(st.MARGIN_FRACTION * out["sync_gain"]["diff"])
    assert out["noninferiority"]["one_step"]["verdict"] == "non-inferior"
    assert out["noninferiority"]["bounded_9"]["verdict"] == "inferior"
    assert out["negative_control"][st.UNTRAINED]["flagged"] and out["negative_control_flagged"]


def test_an_underpowered_run_says_so_and_passes_nothing_by_default():
    rng = random.Random(7)
    n = 100
    base = [rng.random() for _ in range(n)]
    warm, sync = _scores(n, base, 1, k=1), _scores(n, base, 2, k=1)  # no real gain, few prompts
    out = st.convergence(warm, sync, {"one_step": _scores(n, base, 3, k=1)}, {st.UNTRAINED: warm})
    assert not out["powered"]
    if out["margin"] is None:
        assert out["noninferiority"]["one_step"]["verdict"].startswith("no margin")
        assert out["negative_control_flagged"]  # a control is never passed without a margin
    assert not math.isnan(out["sync_gain_se"])


def test_no_controls_means_not_flagged():
    warm, sync = [0.0, 0.25, 0.5], [0.5, 0.5, 0.75]
    assert st.convergence(warm, sync, {}, {})["negative_control_flagged"] is False
