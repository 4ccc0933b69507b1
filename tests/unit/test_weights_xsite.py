"""The cross-site weights benchmark's summary (bench/weights_xsite.py): paired overhead, copies per
version, and the declared real-steps check."""

from __future__ import annotations

import re

import pytest

from bench.weights_xsite import DIGITS_FIRST, summarize


def _run(it: float, grad: float = 0.5, trained: int = 960) -> dict:
    return {"iteration_time_s": it, "tx_bytes": 3_000_000, "versions_at_gen_site": 30, "grad_norm_mean": grad,
            "trained_samples": trained, "grpc_fallbacks": 0}


def test_overhead_is_the_median_of_back_to_back_pairs():
    runs = {"limited": [_run(2.2), _run(2.0), _run(2.1)], "unlimited": [_run(2.0), _run(2.0), _run(2.0)]}
    res = summarize(runs, "one_step", 100_000, router=True, gen_cpus={1})
    assert res["paired_overheads"] == pytest.approx([0.1, 0.0, 0.05])
    assert res["iteration_overhead"] == pytest.approx(0.05)
    assert res["copies_per_version"] == pytest.approx(1.0)
    assert res["real_steps"] is True
    assert "+5.0%" in res["summary"]


@pytest.mark.parametrize("bad", [{"grad": 0.0}, {"trained": 0}])
def test_a_run_without_real_steps_fails_the_check(bad):
    runs = {"limited": [_run(2.0), _run(2.0, **bad)], "unlimited": [_run(2.0), _run(2.0)]}
    assert summarize(runs, "one_step", 100_000, router=False, gen_cpus=None)["real_steps"] is False


def test_the_reward_pattern_separates_a_random_policys_completions():
    assert re.search(DIGITS_FIRST, "12-3>=#4", re.DOTALL)
    assert not re.search(DIGITS_FIRST, "1-23", re.DOTALL)
    assert not re.search(DIGITS_FIRST, "#12", re.DOTALL)
