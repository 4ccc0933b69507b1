"""bench/fleet_cross_site.py's pure parts: the declared even split and the ratios of record."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.fleet_cross_site import TARGET, even_split, iteration_check, summarize


def _alloc(gen: int, train: int, tp: int = 4, iteration: float = 8.0, batch: int = 256) -> dict:
    return {"gen_gpus": gen, "train_gpus": train, "emulation": {"gen_tensor_parallel": tp}, "iteration_s": iteration,
            "samples_per_s": batch / iteration, "samples_per_s_per_cost": batch / iteration / (gen + 2.85 * train),
            "batch_size": batch, "model": "qwen2.5-7b", "gen_parallel": f"DP{gen // tp}xTP{tp}",
            "train_parallel": "DP1xTP1xPP1", "gen_instances": gen // tp, "cost": gen + 2.85 * train,
            "t_gen_s": iteration, "t_train_s": 1.0, "cross_site_weight_transfer_s": 1.5}


def test_the_even_split_is_the_plans_gpus_in_equal_counts_rounded_to_an_instance():
    assert even_split(_alloc(32, 8)) == (20, 20)
    assert even_split(_alloc(32, 8, tp=8)) == (16, 24)
    assert even_split(_alloc(4, 1, tp=4)) == (4, 1)  # at least one instance


def _run(samples_per_s: float, less_link: float) -> dict:
    return {"samples_per_s": samples_per_s, "iteration_s": 256 / samples_per_s, "iteration_error": 0.0,
            "iteration_error_less_link": less_link, "link_explains": less_link <= 0.05,
            "orchestrator_busy_max": 0.5, "cpu_ms_per_sample": 20.0}


def test_emulated_vs_predicted_is_the_emulated_ratio_over_the_planners_per_round():
    allocs = {"plan": _alloc(32, 8, iteration=8.0), "even": _alloc(20, 20, iteration=10.0)}  # predicted 1.25x
    ns = SimpleNamespace(data=None, time_scale=0.25, iterations=12, rounds=3)
    plan = [_run(x, 0.0) for x in (30.0, 30.0, 30.0)]
    even = [_run(x, 0.0) for x in (24.0, 25.0, 30.0)]  # emulated 1.25, 1.2, 1.0
    res = summarize(allocs, {"plan": plan, "even": even}, ns, {})
    assert res["predicted_ratio"] == pytest.approx(1.25)
    assert res["emulated_ratio"]["per_round"] == pytest.approx([1.25, 1.2, 1.0])
    assert res["emulated_vs_predicted"]["per_round"] == pytest.approx([1.0, 0.96, 0.8])
    assert res["emulated_vs_predicted"]["median"] == pytest.approx(0.96) and res["passed"]
    even = [_run(x, 0.2) for x in (30.0, 30.0, 27.0)]  # the emulation sees no gain: 0.8-0.9 of the prediction
    res = summarize(allocs, {"plan": plan, "even": even}, ns, {})
    assert abs(res["emulated_vs_predicted"]["median"] - 1) > TARGET and not res["passed"]
    assert not res["allocations"]["even"]["link_explains"] and res["allocations"]["plan"]["link_explains"]


def test_an_excess_of_up_to_one_link_transfer_is_explained_and_more_or_a_shortfall_is_not():
    assert iteration_check(9.0, 8.0, 1.5) == {"iteration_s": 9.0, "iteration_error": pytest.approx(0.125),
                                              "iteration_error_less_link": pytest.approx(-0.0625),
                                              "link_explains": True}
    assert iteration_check(8.0, 8.0, 1.5)["link_explains"] and iteration_check(9.8, 8.0, 1.5)["link_explains"]
    assert not iteration_check(10.5, 8.0, 1.5)["link_explains"]  # 1 s beyond one transfer
    assert not iteration_check(7.0, 8.0, 1.5)["link_explains"]  # faster than the planner by 12.5%
