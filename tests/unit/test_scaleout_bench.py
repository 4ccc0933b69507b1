"""bench/scaleout.py's summary on hand-made run directories (the benchmark itself is run by hand)."""

from __future__ import annotations

import json

import pytest

from bench.scaleout import markdown, summarize


def _run_dir(path, deltas: list[tuple[float, float]], events: list[dict]):
    path.mkdir()
    rows = [
        {"iteration": k, "response_len_max": 10 + k, "gen_time_s": g, "train_time_s": t, "iteration_time_s": max(g, t)}
        for k, (g, t) in enumerate(deltas)
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "scaleout.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def _decision(k: int, t: float, instances: int, action: str = "hold") -> dict:
    return {"event": "decision", "iteration": k, "t": t, "instances": instances, "delta_prime_s": 1.0, "action": action}


def test_summary_fields_and_definitions(tmp_path):
    gen = [(2, 2), (3, 2), (6, 2), (8, 2), (9, 2), (5, 3), (5, 3), (5, 3), (5, 3)]
    events = [_decision(k, 100 + k, 1, "out" if k == 3 else "hold") for k in range(5)]
    events.append({"event": "scale_out", "iteration": 3, "t": 104.5, "start_s": 1.5, "instances": 2})
    events += [_decision(k, 100 + k, 2) for k in range(5, 9)]
    scaled = _run_dir(tmp_path / "s", gen, events)
    base = _run_dir(tmp_path / "b", [(2, 2), (3, 2), (6, 2), (8, 2), (9, 2), (11, 3), (12, 3), (13, 3), (14, 3)], [])
    r = summarize(scaled, base, window=2, cooldown=1, meta={"mode": "quick", "ramp": "r", "host": "h"})
    assert r["scaleout_events"] == [3]
    assert r["joined_after_iteration"] == 4  # the last iteration read when the instance joined
    assert r["delta_before_s"] == pytest.approx((4 + 6) / 2)  # iterations 2, 3
    assert r["after_iterations"] == [6, 7] and r["delta_after_s"] == pytest.approx(2.0)
    assert r["baseline_delta_after_s"] == pytest.approx((9 + 10) / 2)
    assert r["speedup_after_join"] == pytest.approx((12 + 13 + 14) / 15)
    assert {"delta_before_s", "delta_after_s", "scaleout_events"} <= set(r["definitions"])
    assert r["throughput_after_vs_before"] is None  # meta has no samples_per_iteration: not measured
    r = summarize(scaled, base, window=2, cooldown=1, meta={"mode": "quick", "ramp": "r", "host": "h",
                                                              "samples_per_iteration": 10})
    # tokens/s: before = iterations 2, 3 (lengths 12, 13; times 6, 8), after = 6, 7 (16, 17; 5, 5)
    assert r["tokens_per_s"]["scaleout"]["before"] == pytest.approx(10 * 25 / 14)
    assert r["throughput_after_vs_before"] == pytest.approx((10 * 33 / 10) / (10 * 25 / 14))
    assert r["baseline_throughput_after_vs_before"] == pytest.approx((10 * 33 / 25) / (10 * 25 / 14))
    assert "generated tokens/s before -> after" in markdown(r)
    assert "| 3 |" in markdown(r)


def test_summary_without_an_event_keeps_the_fields(tmp_path):
    scaled = _run_dir(tmp_path / "s", [(1, 2)] * 4, [_decision(k, k, 1) for k in range(4)])
    base = _run_dir(tmp_path / "b", [(1, 2)] * 4, [])
    r = summarize(scaled, base, window=2, cooldown=1, meta={"mode": "quick", "ramp": "r", "host": "h"})
    assert r["scaleout_events"] == [] and r["delta_before_s"] is None and r["delta_after_s"] is None
    assert "Scale-out events after iterations []" in markdown(r)
