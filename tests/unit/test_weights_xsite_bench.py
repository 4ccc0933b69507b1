"""Pure helpers of the cross-site weight benchmark (``bench/weights_xsite.py``)."""

from __future__ import annotations

import re

import pytest

from bench.weights_xsite import DIGITS_FIRST, split_cpus, summarize


def test_split_gives_the_last_cpu_to_generation_and_the_rest_to_the_hosts():
    assert split_cpus({0, 1}) == ({1}, {0})
    assert split_cpus({2, 5, 7}) == ({7}, {2, 5})
    assert split_cpus({3}) is None  # one CPU: nothing to split, everything shares it


def _run(it: float, tx: int = 1000, versions: int = 10, grad: float = 0.5, trained: int = 960) -> dict:
    return {"iteration_time_s": it, "tx_bytes": tx, "versions_at_gen_site": versions, "grpc_fallbacks": 0,
            "grad_norm_mean": grad, "trained_samples": trained}


def test_summary_is_the_median_of_paired_overheads_and_counts_copies_per_version():
    runs = {"limited": [_run(1.10, 1010), _run(0.95, 1000), _run(2.0, 1020)],
            "unlimited": [_run(1.00, 1000), _run(1.00, 1000), _run(1.0, 1000)]}
    out = summarize(runs, "one_step", nbytes=100, router=True, gen_cpus={1})
    assert out["paired_overheads"] == pytest.approx([0.10, -0.05, 1.0])
    assert out["iteration_overhead"] == pytest.approx(0.10)  # one bad pair does not move the median
    assert out["copies_per_version"] == pytest.approx(1.01)
    assert out["generation_cpus"] == [1] and out["router"] is True
    assert out["real_steps"] is True and out["grad_norm_mean"] == pytest.approx(0.5)
    assert "behind the SGS router on CPU [1]" in out["summary"] and "+10.0%" in out["summary"]
    shared = summarize(runs, "one_step", nbytes=100, router=False, gen_cpus=None)
    assert shared["generation_cpus"] is None and "sharing every CPU" in shared["summary"]


@pytest.mark.parametrize("bad", [{"grad": 0.0}, {"trained": 0}])
def test_a_run_without_real_steps_fails_the_declared_check(bad):
    runs = {"limited": [_run(2.0), _run(2.0, **bad)], "unlimited": [_run(2.0), _run(2.0)]}
    assert summarize(runs, "one_step", 100_000, router=False, gen_cpus=None)["real_steps"] is False


def test_the_reward_pattern_separates_a_random_policys_completions():
    assert re.search(DIGITS_FIRST, "12-3>=#4", re.DOTALL)
    assert not re.search(DIGITS_FIRST, "1-23", re.DOTALL)
    assert not re.search(DIGITS_FIRST, "#12", re.DOTALL)
