"""The environment-latency injector's sampler: distributions, truncation, seeding."""

from __future__ import annotations

import statistics

import pytest

from services.agentic.latency import LatencySampler, expected_mean
from services.common.agentic_config import LatencyConfig


def draws(cfg: LatencyConfig, n: int = 20000, stream: int = 0) -> list[float]:
    s = LatencySampler(cfg, stream)
    return [s.sample() for _ in range(n)]


def test_none_and_fixed():
    assert set(draws(LatencyConfig(), 100)) == {0.0}
    assert set(draws(LatencyConfig(kind="fixed", mean_s=0.2), 100)) == {0.2}


@pytest.mark.parametrize("ratio", [0.1, 0.5, 1.0])
def test_normal_matches_the_truncated_normal_and_is_never_negative(ratio):
    cfg = LatencyConfig(kind="normal", mean_s=0.2, std_s=0.2 * ratio)
    x = draws(cfg)
    assert min(x) >= 0.0
    se = statistics.stdev(x) / len(x) ** 0.5
    assert abs(statistics.fmean(x) - expected_mean(cfg)) < 5 * se
    if ratio <= 0.1:  # truncation is negligible: plain N(mu, sigma)
        assert statistics.stdev(x) == pytest.approx(0.02, rel=0.05)
    if ratio == 1.0:  # truncation lifts the mean: mu + sigma * phi(-1) / (1 - Phi(-1)) = 1.2876 mu
        assert expected_mean(cfg) == pytest.approx(0.2 * 1.2876, rel=1e-3)


def test_streams_are_reproducible_and_distinct():
    cfg = LatencyConfig(kind="normal", mean_s=1.0, std_s=0.5, seed=3)
    assert draws(cfg, 50, stream=7) == draws(cfg, 50, stream=7)
    assert draws(cfg, 50, stream=7) != draws(cfg, 50, stream=8)
    assert draws(cfg, 50, stream=7) != draws(LatencyConfig(kind="normal", mean_s=1.0, std_s=0.5, seed=4), 50, stream=7)
