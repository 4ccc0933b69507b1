"""Pure parts of bench/coordination.py: per-run repack metrics, the summary and its report."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
for _p in (BENCH.parent, BENCH):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import coordination as co  # noqa: E402


def test_run_metrics_weights_kv_by_snapshots_and_skips_the_first_iteration():
    rows = [
        {"kv_usage_mean": 0.9, "kv_snapshots": 50, "bound_violations": 0},  # start-up: excluded
        {"kv_usage_mean": 0.2, "kv_snapshots": 1, "bound_violations": 0, "repack_overhead_s_mean": 0.01,
         "repack_overhead_s_max": 0.02},
        {"kv_usage_mean": 0.5, "kv_snapshots": 3, "bound_violations": 1, "repacks": 2, "migrated": 7},
    ]
    m = co.run_metrics(rows)
    assert m["kv_usage_mean"] == pytest.approx((0.2 + 1.5) / 4)
    assert m["repacks"] == 2 and m["migrated"] == 7 and m["violations"] == 1
    assert m["repack_overhead_s_max"] == 0.02
    assert co.run_metrics([{"kv_usage_mean": None, "kv_snapshots": 0}])["kv_usage_mean"] is None


def _run(tps: float, sps: float, kv: float, migrated: int = 0, overhead: float | None = None) -> dict:
    return {"tokens_per_s": tps, "samples_per_s": sps, "kv_usage_mean": kv, "migrated": migrated,
            "repack_overhead_s_mean": overhead, "repack_overhead_s_max": overhead, "violations": 0,
            "staleness": {"violations": 0}}


def test_summary_ratios_are_per_round_and_the_goal_can_fail():
    runs = {"none": [_run(100, 10, 0.3), _run(120, 12, 0.35), _run(90, 9, 0.3)],
            "repack": [_run(110, 10, 0.4, 5, 0.01), _run(126, 13, 0.45, 3, 0.03), _run(99, 9, 0.4, 4, 0.02)]}
    res = co.summarize(runs)
    assert res["repack_vs_none_gen_throughput"] == pytest.approx(1.1)  # 1.10, 1.05, 1.10
    assert not res["goal_met"]
    assert res["kv_utilisation"] == {"none": 0.3, "repack": 0.4}
    assert res["repack_overhead_s"]["max"] == 0.03 and res["migrations_per_run"] == [5, 3, 4]
    assert res["staleness_violations"] == 0 and res["sim_vs_measured_error"] is None
    res.update(runs=runs, order=["none#0"], settings={"instances": 2, "pinned": True, "iterations": 30, "rounds": 3},
               provenance={"engine": "vllm", "commit": "a" * 40, "dirty": False, "date": "d",
                           "machine": {"cpu": "c", "cores": 2}})
    text = co.markdown(res)
    assert "Goal >= 1.15x: **missed**" in text and "mean 20 ms, max 30 ms" in text
    assert "Other instance counts" not in text
    res["other_configurations"] = {"instances_2": {**co.summarize(runs), "settings": {"instances": 2}}}
    assert "| 2 | 1.100x [1.050–1.100]" in co.markdown(res)


def test_replay_section_is_rendered_from_its_own_entry_and_recorded_lengths_are_read(tmp_path):
    import gzip
    import json

    src = tmp_path / "lengths.jsonl.gz"
    with gzip.open(src, "wt") as f:
        for chars in (400, 0, 8192):
            f.write(json.dumps({"resp_chars": {co.REPLAY_MODEL: chars, "other": 7}}) + "\n")
    assert co.recorded_lengths(src, co.REPLAY_MODEL) == [100.0, 2048.0]  # empty responses left out
    with pytest.raises(ValueError, match="no response lengths"):
        co.recorded_lengths(src, "absent")
    runs = {"none": [_run(100, 10, 0.3)], "repack": [_run(90, 9, 0.4, 2, 0.05)]}
    entry = {**co.summarize(runs), "order": ["none#0", "repack#0"],
             "settings": {"instances": 4, "iterations": 30, "rounds": 1},
             "provenance": {"commit": "b" * 40, "dirty": False, "date": "d"},
             "workload": {"source": "s", "model": "m", "chars_per_token": 4.0, "source_cap": 2048, "scale": 0.09375,
                          "lengths": {"n": 2, "mean": 20.7, "p50": 8, "p90": 33, "p99": 192, "max": 192, "cap": 192,
                                      "at_cap": 0.022, "top20_token_share": 0.73}}}
    assert co.replay_lines({}) == []
    text = "\n".join(co.replay_lines({"workloads": {"replay": entry}}))
    assert "**0.900x** [0.900–0.900]" in text and "Goal >= 1.15x: **missed** by the median (per round: 0.900x)" in text
    assert "p50 8, p90 33, p99 192" in text and "x 0.09375" in text


def test_the_headline_is_the_declared_configuration_and_the_others_carry_their_loss_against_it():
    def config(n: int, none_tps: list[float]) -> dict:
        runs = {"none": [_run(t, 10, 0.3) for t in none_tps],
                "repack": [_run(t * 1.2, 10, 0.4, 2, 0.01) for t in none_tps]}
        return {**co.summarize(runs), "runs": runs, "settings": {"instances": n}}

    head = co.headline({2: config(2, [100, 110, 90]), 4: config(4, [50, 60, 45])})
    assert co.RECORD_INSTANCES == 2 and head["settings"]["instances"] == 2
    assert head["record_configuration"] == {"instances": 2, "measured": True}
    other = head["other_configurations"]["instances_4"]
    assert other["none_tokens_per_s_vs_record"]["median"] == pytest.approx(0.5)  # 0.5, 0.545, 0.5
    only_four = co.headline({4: config(4, [50, 60, 45])})
    assert only_four["record_configuration"]["measured"] is False and only_four["other_configurations"] == {}
