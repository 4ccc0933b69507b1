"""bench/gpu_train.py's pure parts: the roofline comparison and achieved MFU of measured points."""

from __future__ import annotations

import pytest

from allocator.train_profile import make_point
from allocator.training import step_flops
from bench.gpu_train import ARCHS, TARGETS, VARIANTS, markdown, summarize
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
        "models": {"smollm2-135m": {"roofline": measured, "plain": {"error": "OutOfMemoryError: CUDA"}}},
        "roofline_median_rel_error": {"smollm2-135m": measured["roofline_median_rel_error"]},
        "targets_met": {"smollm2-135m": measured["roofline_median_rel_error"] <= TARGETS["roofline_median_rel_error"]}}
    text = markdown(result)
    assert "**missed**" in text and "failed: OutOfMemoryError" in text
    assert set(VARIANTS) == {"roofline", "plain"}
