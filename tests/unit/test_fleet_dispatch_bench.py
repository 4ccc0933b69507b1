"""Pure parts of the emulated fleet dispatch benchmark (``bench/fleet_dispatch.py``): the replay
rows, the ranker's quality, ratios to the best length-blind variant, the pairs the rounds resolve,
the simulator's order and error, and the targets declared before the run."""

from __future__ import annotations

import pytest

from bench import fleet_dispatch as fd


def test_the_declared_comparison_is_the_issues():
    assert set(fd.LENGTH_BLIND) == {"pick", "round_robin", "least_loaded", "least_tokens"}
    assert {fd.HEADLINE_RANKER, "alg2+ranker", "lpt+ranker"} == set(fd.RANKER) and fd.HEADLINE_ORACLE in fd.ORACLE
    assert {b.split("/")[1] for b in fd.BLOCKS} == {"sync", "one_step"}
    assert len({b.split("/")[0] for b in fd.BLOCKS}) == 2  # two real traces
    assert f"{fd.TRACE_OF_RECORD}/{fd.REGIME_OF_RECORD}" in fd.BLOCKS and fd.ROUNDS >= 3
    assert fd.TARGETS == {"ranker_vs_best_length_blind": (">=", 1.10), "sim_error_max_per_policy": ("<=", 0.10),
                          "sim_policy_order_matches": ("==", True)}
    # Algorithm 2 alone admits FCFS; LPT admission alone places length-blind; both together is StreamRL's design
    assert "generation.admission=fcfs" in fd.VARIANTS["alg2+ranker"]
    assert "generation.dispatch.policy=least_loaded" in fd.VARIANTS["lpt+ranker"]
    assert "forced_length_replay.estimates=oracle" in fd.VARIANTS[fd.HEADLINE_ORACLE]
    assert all("forced_length_replay" not in o for v in fd.LENGTH_BLIND.values() for o in v)


def test_replay_rows_take_the_traces_model_and_the_rankers_estimate_in_tokens():
    estimates = [{"id": "1", "estimated_length": 400.0}, {"id": "2", "estimated_length": 8000.0}]
    chars = {"1": {"m": 800, "o": 40}, "2": {"m": 9000, "o": 12}}
    rows = fd.replay_rows(estimates, chars, "m", cap=1024)  # 2048-token budget onto 1024: x 0.5
    assert rows == [{"length": 100, "estimate": 50.0}, {"length": 1024, "estimate": 1000.0}]
    assert [r["length"] for r in fd.replay_rows(estimates, chars, "o", cap=2048)] == [10, 3]
    with pytest.raises(ValueError, match="no recorded response for 1 prompts"):
        fd.replay_rows(estimates, {"1": {"m": 8}, "2": {}}, "m", cap=2048)


def test_the_rankers_quality_on_a_trace():
    rows = [{"length": n, "estimate": float(n)} for n in range(1, 11)]
    t = fd.trace_summary(rows, "m", cap=10)
    assert t["model"] == "m" and t["ranker_spearman"] == pytest.approx(1.0) and t["ranker_recall_at_20"] == 1.0
    rows[0]["estimate"], rows[8]["estimate"] = 50.0, 0.0  # top 2 by estimate: 1 and 10; truly 9 and 10
    assert fd.trace_summary(rows, "m", cap=10)["ranker_recall_at_20"] == 0.5
    backwards = fd.trace_summary([{"length": n, "estimate": -n} for n in range(1, 11)], "m", cap=10)
    assert backwards["ranker_spearman"] == pytest.approx(-1.0) and backwards["ranker_recall_at_20"] == 0.0


def test_ratios_are_to_the_best_length_blind_variant_round_by_round():
    spans = {"pick": [10.0, 12.0, 11.0], "round_robin": [9.0, 13.0, 10.0], "alg2+lpt+ranker": [9.0, 10.0, 11.0]}
    blind, ratio = fd.vs_best(spans)
    assert blind == "round_robin"  # lowest median makespan (10 vs 11)
    assert ratio["alg2+lpt+ranker"]["per_repeat"] == [1.0, 1.3, 10.0 / 11.0]
    assert ratio["round_robin"]["median"] == 1.0
    tps = {"pick": [5.0, 6.0, 7.0], "least_loaded": [6.5, 6.5, 6.5], "x": [13.0, 13.0, 13.0]}
    blind, ratio = fd.vs_best(tps, lower_is_better=False)
    assert blind == "least_loaded" and ratio["x"]["median"] == 2.0  # throughput: variant / blind
    with pytest.raises(ValueError, match="length-blind"):
        fd.best_blind({"x": [1.0]})


def test_a_pair_is_resolved_only_when_its_order_is_the_same_in_every_round():
    spans = {"a": [1.0, 1.0, 1.0], "b": [2.0, 2.0, 0.5], "c": [3.0, 3.0, 3.0]}
    assert fd.resolved_pairs(spans) == [("a", "c"), ("b", "c")]
    assert fd.resolved_pairs({"a": [1.0, 2.0], "b": [1.0, 3.0]}) == []  # a tie in one round resolves nothing


def test_the_simulators_order_is_judged_on_resolved_pairs_it_does_not_tie():
    emulated = {"a": [1.0, 1.1, 1.0], "b": [2.0, 2.1, 2.2], "c": [1.5, 1.6, 1.55]}
    agrees = fd.order_agreement(emulated, {"a": [1.0] * 3, "b": [2.0] * 3, "c": [1.4] * 3})
    assert agrees["matches"] is True and len(agrees["judged_pairs"]) == 3 and agrees["tied_pairs"] == []
    assert agrees["order_simulated"] == ["a", "c", "b"]
    flipped = fd.order_agreement(emulated, {"a": [1.0] * 3, "b": [0.9] * 3, "c": [1.4] * 3})
    assert flipped["matches"] is False
    assert {tuple(p["pair"]) for p in flipped["judged_pairs"] if not p["agrees"]} == {("a", "b"), ("c", "b")}
    # identical schedules in the simulator: no prediction, listed with the emulated ratio, not judged
    tied = fd.order_agreement({"a": [1.0, 1.0, 1.0], "b": [1.1, 1.1, 1.1]}, {"a": [2.0] * 3, "b": [2.001] * 3})
    assert tied["matches"] is None and tied["tied_pairs"][0]["pair"] == ["a", "b"]
    assert tied["tied_pairs"][0]["emulated_ratio"] == pytest.approx(1.1)


def test_sim_error_is_the_median_rounds_ratio_and_the_largest_over_policies():
    err = fd.sim_errors({"a": [1.1, 1.0, 1.2], "b": [1.0, 1.0, 1.0]}, {"a": [1.0] * 3, "b": [0.8, 1.0, 1.25]})
    assert err["per_policy"]["a"]["error"] == pytest.approx(0.1) and err["per_policy"]["b"]["error"] == 0.0
    assert (err["worst"], err["max"]) == ("a", pytest.approx(0.1))


def _run(span: float, sim: float | None, tps: float = 100.0) -> dict:
    return {"gen_span_s": span, "tokens_per_s": tps, "orchestrator_busy_max": 0.3, "cpu_ms_per_sample": 9.0,
            "cores_busy": 0.6, "flagged": False, "sim_gen_span_s": sim, "dispatch_plan_s": 0.01}


def _block(sim: bool, ranker: float = 9.0) -> dict:
    def runs(span: float) -> list[dict]:
        return [_run(span + 0.1 * r, (span + 0.1 * r) * 1.05 if sim else None) for r in range(3)]

    return fd.summarize_block({"pick": runs(10.0), "least_loaded": runs(10.5), fd.HEADLINE_RANKER: runs(ranker),
                               "lpt+ranker": runs(9.5), fd.HEADLINE_ORACLE: runs(8.0)})


def test_the_headline_reads_the_block_of_record_and_the_simulator_over_sync_blocks():
    blocks = {f"{fd.TRACE_OF_RECORD}/sync": _block(True), f"{fd.TRACE_OF_RECORD}/one_step": _block(False, 20.0)}
    head = fd.headline(blocks)
    assert head["ranker_vs_best_length_blind"]["median"] == pytest.approx(10.1 / 9.1)
    assert head["ranker_vs_best_length_blind"]["best_length_blind"] == "pick"
    assert head["oracle_vs_best_length_blind"]["median"] == pytest.approx(10.1 / 8.1)
    assert head["best_ranker_vs_best_length_blind"]["variant"] == fd.HEADLINE_RANKER
    assert head["sim_error_max_per_policy"] == pytest.approx(1 - 1 / 1.05)  # emulated / simulated = 1 / 1.05
    assert head["sim_policy_order_matches"] is True and head["sim_blocks"] == [f"{fd.TRACE_OF_RECORD}/sync"]
    assert "sim" not in blocks[f"{fd.TRACE_OF_RECORD}/one_step"]
    v = fd.verdicts(head)
    assert v["ranker_vs_best_length_blind"]["met"] is True and v["sim_error_max_per_policy"]["met"] is True
    assert v["sim_policy_order_matches"]["met"] is True
    missed = fd.verdicts(fd.headline({f"{fd.TRACE_OF_RECORD}/sync": _block(True, ranker=9.9)}))
    assert missed["ranker_vs_best_length_blind"]["met"] is False
    assert fd.verdicts({})["ranker_vs_best_length_blind"] == {"value": None, "target": ">= 1.1", "met": None}


def test_the_report_says_emulated_and_names_every_block():
    blocks = {f"{fd.TRACE_OF_RECORD}/sync": _block(True), f"{fd.TRACE_OF_RECORD}/one_step": _block(False)}
    head = fd.headline(blocks)
    res = {**head, "verdicts": fd.verdicts(head), "blocks": blocks,
           "traces": {"llama8b": {"model": "m", "lengths": {"p50": 80, "p99": 2000, "at_cap": 0.02},
                                  "ranker_spearman": 0.6, "ranker_recall_at_20": 0.55}},
           "settings": {"instances": 32, "time_scale": 0.25, "max_inflight": 8, "prompts": 64, "iterations": 3,
                        "rounds": 3},
           "provenance": {"commit": "0" * 40, "dirty": False, "config_hash": "x", "date": "d", "versions": {},
                          "machine": {"cpu": "c", "cores": 2, "mem_gb": 24}}}
    text = fd.markdown(res)
    assert text.startswith("# EMULATED") and text.count("(EMULATED)") == 2
    assert "`ranker_vs_best_length_blind`: 1.110 (target >= 1.1: met)" in text
