"""bench/gpu_train.py's pure parts: the roofline comparison and achieved MFU of measured points."""

from __future__ import annotations

import pytest

from allocator.train_profile import make_point
from allocator.training import step_flops
from bench.gpu_train import ARCHS, RUNS, VARIANTS, headlines, markdown, summarize
from services.generation.scheduling.hardware import get_hardware
from services.generation.scheduling.models import spec_from_hf_config


def _spec(name="qwen2.5-1.5b"):
    return spec_from_hf_config(name, ARCHS[name][1], dtype_bytes=2)


def test_a_point_at_the_roofline_speed_has_no_error_and_the_roofline_mfu():
    spec, hw = _spec(), get_hardware("H100")
    probe = make_point(32, 12, 1024, 1.0)
    at_roofline = step_flops(spec, probe.workload("grpo")) / (hw.bf16_tflops * 1e12 * 0.40)
    out = summarize(spec, [make_point(32, 12, 1024, at_roofline)], "roofline", hw)
    assert out["roofline_median_rel_error"] == pytest.approx(0.0, abs=1e-9)
    assert out["mfu_median"] == pytest.approx(0.40)
    # the plain variant computes 3 of the roofline's 5 forward-equivalents in the same time
    assert summarize(spec, [make_point(32, 12, 1024, at_roofline)], "plain", hw)["mfu_median"] == pytest.approx(0.24)


def test_a_learner_twice_as_slow_as_the_roofline_is_off_by_half():
    spec, hw = _spec("smollm2-135m"), get_hardware("H100")
    p = make_point(64, 12, 256, 1.0)
    pred = summarize(spec, [p], "roofline", hw)["points"][0]["roofline_s"]
    slow = [make_point(64, 12, 256, 2 * pred), make_point(64, 12, 1024, 10.0)]
    out = summarize(spec, slow, "roofline", hw)
    assert out["points"][0]["roofline_rel_error"] == pytest.approx(0.5)
    assert out["roofline_max_rel_error"] > 0.5 and out["mfu_largest"] == out["points"][1]["mfu"]
    assert out["points"][0]["tokens_per_s"] == pytest.approx(64 * 268 / (2 * pred))


def test_the_report_marks_a_missed_target_and_a_failed_variant():
    spec, hw = _spec("smollm2-135m"), get_hardware("H100")
    measured = summarize(spec, [make_point(64, 12, 256, 1.0)], "roofline", hw)
    result = {"device": "NVIDIA H100 80GB HBM3", "provenance": {
        "commit": "0" * 40, "dirty": False, "config_hash": "x", "date": "2026-11-27",
        "machine": {"cpu": "x", "cores": 16, "mem_gb": 128}, "versions": {}},
        **headlines({"smollm2-135m": {"roofline@4096": {**measured, "variant": "roofline", "micro_batch_tokens": 4096},
                                      "plain@4096": {"error": "OutOfMemoryError: CUDA"}}})}
    text = markdown(result)
    assert "**missed**" in text and "failed: OutOfMemoryError" in text
    assert set(VARIANTS) == {"roofline", "plain"} and all(v in VARIANTS for runs in RUNS.values() for v, _ in runs)


def test_headlines_judge_the_largest_budget_and_the_speedup_over_the_cpu_default():
    spec, hw = _spec("smollm2-135m"), get_hardware("H100")

    def run(variant, mbt, seconds):
        out = summarize(spec, [make_point(64, 12, 256, s) for s in seconds], variant, hw)
        return {**out, "variant": variant, "micro_batch_tokens": mbt}

    h = headlines({"smollm2-135m": {"plain@4096": run("plain", 4096, [4.0, 8.0]),
                                    "plain@32768": run("plain", 32768, [1.0, 4.0]),
                                    "roofline@4096": run("roofline", 4096, [9.0]),
                                    "roofline@32768": run("roofline", 32768, [1.0])}})
    assert h["micro_batch_speedup"]["smollm2-135m"] == pytest.approx(3.0)  # median of 4x and 2x
    big = summarize(spec, [make_point(64, 12, 256, 1.0)], "roofline", hw)["roofline_median_rel_error"]
    assert h["roofline_median_rel_error"]["smollm2-135m"] == pytest.approx(big)
    assert h["targets_met"]["smollm2-135m"] is False
