"""The coordination simulator's verdict text (bench/coordination_sim.py): every clause from the numbers."""

from __future__ import annotations

from bench.coordination_sim import _direction, status


def test_direction_names_a_disagreement_in_sign():
    assert _direction(1.10, 1.20) == "predicts a gain, as measured"
    assert _direction(1.01, 0.92) == "predicts no change where the runs measured a loss"
    assert _direction(1.16, 1.01) == "predicts a gain where the runs measured no change"


def _detail(ratio: float, none_tps: float) -> dict:
    return {"ratio": ratio, "ratios": [ratio, ratio + 0.01], "runs": [{"none": [none_tps, 0.0]}]}


def test_status_reads_the_headline_and_each_other_count_from_the_results():
    doc = {"settings": {"instances": 2}, "repack_vs_none_gen_throughput": 0.92,
           "other_configurations": {"instances_4": {"runs": {"none": [{"tokens_per_s": 3000.0},
                                                                      {"tokens_per_s": 3100.0}]}}}}
    detail = {"calibration": {"cpu_scale": 1.16, "runaway_share": 0.041}, "headline": _detail(1.01, 4700.0)}
    others = {"instances_4": {"instances": 4, "predicted": _detail(1.095, 3765.0), "measured": 1.208, "error": 0.094}}
    text = status(0.103, detail, others, doc)
    assert "calibrated only from the none runs of 2 instances" in text
    assert "within the 15% target; 2 instances: predicts no change where the runs measured a loss" in text
    assert ("4 instances: predicted 1.095x vs measured 1.208x (error 9.4%, per seed 1.09-1.10x; "
            "predicts a gain, as measured)" in text)
    assert "it puts their none run at 3765 tokens/s, above the 3050 measured" in text
