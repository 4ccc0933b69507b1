"""bench/emulation.py's pure parts: paired errors, the declared target's verdict, the summary and its table."""

from __future__ import annotations

import pytest

from bench.emulation import ENGINES, TARGET_ERROR, TRACES, errors, markdown, median_run, summarise, verdict


def test_errors_pair_the_rounds_and_keep_each():
    err = errors([105.0, 90.0, 100.0], [100.0, 100.0, 100.0])
    assert err["per_round"] == pytest.approx([0.05, -0.10, 0.0])
    assert (err["median"], err["min"], err["max"], err["n"]) == (pytest.approx(0.0), pytest.approx(-0.10),
                                                                 pytest.approx(0.05), 3)
    with pytest.raises(ValueError, match="2 emulated vs 3 real rounds"):
        errors([1.0, 2.0], [1.0, 2.0, 3.0])


def test_the_target_is_met_by_the_median_and_a_round_outside_it_is_flagged():
    assert TARGET_ERROR == 0.05
    inside = verdict(errors([104.0, 103.0, 110.0], [100.0, 100.0, 100.0]))
    assert inside["met"] and inside["spread_crosses_target"]
    outside = verdict(errors([94.0, 93.0, 99.0], [100.0, 100.0, 100.0]))
    assert not outside["met"]


def _round(scale: float) -> dict:
    return {e: {t: {"tokens_per_s": 1000.0 * (scale if e == "emulated" else 1.0),
                    "last_sample_s": 2.0 / (scale if e == "emulated" else 1.0), "lengths_ok": True}
                for t in TRACES} for e in ENGINES}


def test_the_summary_keeps_measured_and_emulated_apart_and_the_table_says_which_missed():
    out = summarise([_round(1.02), _round(1.03), _round(1.10)])
    arith = out["arith"]
    assert arith["measured_vllm"]["measured_in_this_run"] and arith["EMULATED"]["emulated"]
    assert "measured_in_this_run" not in arith["EMULATED"]
    assert arith["throughput_error"]["median"] == pytest.approx(0.03) and arith["throughput_error"]["met"]
    assert arith["makespan_error"]["median"] == pytest.approx(1 / 1.03 - 1)
    result = {"provenance": {"commit": "0" * 40, "dirty": False, "config_hash": "h", "date": "d", "command": "c",
                             "versions": {}, "machine": {"cpu": "cpu", "cores": 2, "mem_gb": 8.0}},
              "workload": {"n": 64, "cap": 256, "cpu": 1, "mean_length": dict.fromkeys(TRACES, 50.0)},
              "rounds": 3, "profile": {"fit_rel_rmse": 0.02}, "traces": summarise([_round(1.2)] * 3)}
    text = markdown(result)
    assert "EMULATED" in text and "**missed**" in text and "+20.0%" in text


def test_a_round_takes_the_median_repeat_and_the_table_says_the_profile_was_measured_each_round():
    runs = [{"last_sample_s": t, "tokens_per_s": 100 / t, "lengths_ok": ok} for t, ok in ((2.0, True), (1.0, True),
                                                                                          (3.0, False))]
    got = median_run(runs)
    assert got["last_sample_s"] == 2.0 and got["tokens_per_s"] == 50.0 and got["repeats_s"] == [2.0, 1.0, 3.0]
    assert not got["lengths_ok"]  # one repeat with a wrong length spoils the round
    result = {"provenance": {"commit": "0" * 40, "dirty": False, "config_hash": "h", "date": "d", "command": "c",
                             "versions": {}, "machine": {"cpu": "cpu", "cores": 2, "mem_gb": 8.0}},
              "workload": {"n": 64, "cap": 256, "cpu": 1, "mean_length": dict.fromkeys(TRACES, 50.0)},
              "rounds": 5, "repeats": 3, "traces": summarise([_round(1.01)] * 5),
              "profile": {"per_round": True, "repeats": 3,
                          "fit_rel_rmse": {"median": 0.05, "min": 0.04, "max": 0.08, "n": 5}}}
    text = markdown(result)
    assert "in each round, before its engines" in text and "0.050 [0.040-0.080]" in text and "median of 3 runs" in text
