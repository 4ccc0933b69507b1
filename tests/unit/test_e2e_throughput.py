"""Pure parts of bench/e2e_throughput.py: the interleaved order, the comparisons, the flagged
ratios and the report. No runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
for _p in (BENCH.parent, BENCH):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import e2e_throughput as et  # noqa: E402

from bench.report_io import set_json_key  # noqa: E402


def _run(sps: float, tps: float, violations: int = 0) -> dict:
    return {"samples_per_s": sps, "tokens_per_s": tps, "staleness": {"violations": violations},
            "started_at": 0.0, "run_dir": "x"}


def test_each_mode_takes_each_position_once_in_as_many_rounds():
    modes = ["sync", "one_step", "bounded_2"]
    orders = [et.round_order(modes, r) for r in range(3)]
    assert orders[0] == modes
    for pos in range(3):
        assert sorted(o[pos] for o in orders) == sorted(modes)
    assert et.round_order(modes, 4) == orders[1]


def test_comparisons_are_against_sync_plus_the_target_pairs_that_ran():
    assert et.comparisons(["sync", "one_step"]) == [("one_step", "sync")]
    assert et.comparisons(["sync", "one_step", "bounded_2"]) == [
        ("one_step", "sync"), ("bounded_2", "sync"), ("bounded_2", "one_step")]
    assert et.comparisons(["sync", "one_step", "bounded_2", "bounded_2_staleflow"])[-2:] == [
        ("bounded_2_staleflow", "one_step"), ("bounded_2_staleflow", "bounded_2")]  # beside, with no target


def test_ratios_are_per_round_medians_and_noise_is_flagged():
    runs = {
        "sync": [_run(100, 1000), _run(120, 1200), _run(80, 800)],
        # one_step: same round 1.3x, 1.25x, 1.35x -> median 1.3, range 0.1 < effect 0.3
        "one_step": [_run(130, 1300), _run(150, 1500), _run(108, 1000)],
        # bounded_2: 1.05x, 0.9x, 1.2x -> median 1.05, range 0.3 >= effect 0.05: flagged
        "bounded_2": [_run(105, 1000), _run(108, 1000), _run(96, 800, violations=1)],
    }
    res = et.summarize(["sync", "one_step", "bounded_2"], runs)
    one = res["ratios"]["one_step/sync"]["samples_per_s"]
    assert one["median"] == pytest.approx(1.3) and one["per_repeat"] == pytest.approx([1.3, 1.25, 1.35])
    assert not one["spread_as_large_as_effect"]
    b2 = res["ratios"]["bounded_2/sync"]["samples_per_s"]
    assert b2["median"] == pytest.approx(1.05) and b2["spread_as_large_as_effect"]
    assert res["targets"] == {"one_step/sync >= 1.25x": True, "bounded_2/one_step >= 1x": False}
    assert res["modes"]["sync"]["samples_per_s"] == {"median": 100, "min": 80, "max": 120, "n": 3}
    assert res["staleness_violations"] == 1


def test_report_renders_and_e2e_keeps_only_its_part(tmp_path):
    runs = {"sync": [_run(100, 1000)] * 3, "one_step": [_run(110, 1150)] * 3}
    res = et.summarize(["sync", "one_step"], runs)
    res.update(settings={"rounds": 3, "modes": ["sync", "one_step"], "iterations": 100, "instances": 2,
                         "pinned": True}, order=["sync#0", "one_step#0"], runs=runs,
               provenance={"commit": "a" * 40, "dirty": False, "date": "2026-11-25", "engine": "vllm",
                           "machine": {"cpu": "cpu", "cores": 2}})
    text = et.markdown(res)
    assert "| one_step/sync | **1.10x** [1.10–1.10] | **1.15x** [1.15–1.15] |" in text
    assert "one_step/sync >= 1.25x: **missed**" in text
    path = tmp_path / "e2e.json"
    path.write_text(json.dumps({"samples_per_s": {"sync": 1.0}}))
    set_json_key(path, "throughput_interleaved", et.e2e_entry(res))
    doc = json.loads(path.read_text())
    assert doc["samples_per_s"] == {"sync": 1.0}
    assert doc["throughput_interleaved"]["ratios"]["one_step/sync"]["samples_per_s"]["median"] == pytest.approx(1.1)
    assert "runs" not in doc["throughput_interleaved"]
