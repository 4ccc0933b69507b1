"""Measured training step-time profiles: the NNLS fit, model checks, names and selection by
hardware/model/algorithm/backend, the cost model with and without a profile, and the cluster
file's ``train_profile`` / ``train_backend``."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from allocator.allocate import format_table, plan_files
from allocator.cluster import AllocationInputError
from allocator.memory import ParallelConfig
from allocator.train_profile import (
    find_train_profile,
    fit_step_time,
    load_train_profile,
    make_point,
    make_train_profile,
    nnls,
    profile_filename,
)
from allocator.training import MFU, TrainSite, TrainWorkload, padded_step_flops, step_flops, step_time
from services.generation.scheduling.hardware import get_hardware
from services.generation.scheduling.models import get_model
from services.generation.scheduling.profiles import PROFILE_DIR, ProfileError, save_profile

ROOT = Path(__file__).resolve().parents[2]
TINY = get_model("braid-tiny")
GRID = [(s, 12, r) for s in (8, 32, 64) for r in (16, 64, 192)]


def _profile(fixed: float = 0.02, eff: float = 5e9, model=TINY, hardware: str = "cpu-local", backend: str = "torch",
             dtype: str = "float32", spread: bool = False):
    """A profile whose points lie exactly on ``fixed + padded flops / eff`` (``spread``: each point's
    sequences of mixed lengths in two backward calls, so the learner pads)."""
    points = []
    for s, p, r in GRID:
        calls = [[p + r // (1 + i % 3) for i in range(s // 2)], [p + r] * (s - s // 2)] if spread else None
        pt = make_point(s, p, r, 1.0, calls)
        points.append(make_point(s, p, r, fixed + padded_step_flops(model, pt.workload("grpo")) / eff, calls))
    return make_train_profile(model, points, hardware=hardware, algorithm="grpo", reference_model=False,
                              device="cpu", threads=1, backend=backend, dtype=dtype)


def test_fit_recovers_known_coefficients():
    prof = _profile(fixed=0.02, eff=5e9)
    assert math.isclose(prof.fixed_s, 0.02, rel_tol=1e-9) and math.isclose(prof.effective_flops, 5e9, rel_tol=1e-9)
    assert prof.fit_max_rel_error < 1e-9 and prof.fit_median_rel_error < 1e-9
    # with +-5% multiplicative noise the fit stays close and reports errors of that size
    rng = np.random.default_rng(0)
    flops = np.geomspace(1e9, 1e11, 12)
    seconds = (0.05 + flops / 2e10) * rng.uniform(0.95, 1.05, flops.size)
    fixed, eff, max_err, med_err = fit_step_time(flops, seconds)
    assert abs(fixed - 0.05) < 0.01 and abs(eff / 2e10 - 1) < 0.05 and 0 < med_err <= max_err < 0.1


def test_points_record_the_padded_work_and_the_fit_prices_it():
    pt = make_point(4, 10, 30, 0.5, [[15, 40], [40, 40]])
    assert (pt.tokens, pt.padded_tokens, pt.micro_batches,
            pt.attn_sq, pt.padded_attn_sq) == (135, 160, 2, 5025.0, 6400.0)
    assert make_point(8, 12, 16, 0.1).padded_tokens == make_point(8, 12, 16, 0.1).tokens == 224
    with pytest.raises(ValueError, match="8 samples but 2 sequence lengths"):
        make_point(8, 12, 16, 0.1, [[28, 28]])
    prof = _profile(fixed=0.03, eff=4e9, spread=True)
    assert any(p.padded_tokens > 1.2 * p.tokens for p in prof.points)
    assert math.isclose(prof.fixed_s, 0.03, rel_tol=1e-9) and math.isclose(prof.effective_flops, 4e9, rel_tol=1e-9)


def test_a_profile_without_backend_fields_loads_with_the_defaults(tmp_path):
    raw = json.loads(save_profile(_profile(), tmp_path / "new.json").read_text())
    for key in ("backend", "dtype", "ranks", "group_size", "micro_batch_groups", "activation_checkpointing"):
        del raw[key]
    for pt in raw["points"]:
        del pt["padded_tokens"], pt["padded_attn_sq"], pt["micro_batches"]
    (tmp_path / "old.json").write_text(json.dumps(raw))
    prof = load_train_profile(tmp_path / "old.json")
    assert (prof.backend, prof.dtype, prof.ranks,
            prof.group_size, prof.micro_batch_groups) == ("torch", "float32", 1, 8, 8)
    wl = prof.points[0].workload("grpo")
    assert padded_step_flops(TINY, wl) == step_flops(TINY, wl)


def test_profile_names_leave_the_defaults_out():
    assert profile_filename("cpu-local", "braid-tiny") == "cpu-local-braid-tiny-train.json"
    assert (profile_filename("H100", "qwen2.5-7b", "megatron", "bfloat16")
            == "H100-qwen2.5-7b-megatron-bfloat16-train.json")
    assert profile_filename("H100", "qwen2.5-7b", "torch", "bfloat16") == "H100-qwen2.5-7b-bfloat16-train.json"


def test_find_train_profile_matches_hardware_model_algorithm_and_backend(tmp_path):
    torch32 = save_profile(_profile(), tmp_path / profile_filename("cpu-local", "braid-tiny"))
    mega = save_profile(_profile(backend="megatron", dtype="bfloat16"),
                        tmp_path / profile_filename("cpu-local", "braid-tiny", "megatron", "bfloat16"))
    save_profile(_profile(hardware="H800"), tmp_path / profile_filename("H800", "braid-tiny"))
    find = functools.partial(find_train_profile, tmp_path, model=TINY, algorithm="grpo")
    assert find(hardware="cpu-local") == torch32 and find(hardware="cpu-local", backend="megatron") == mega
    assert find(hardware="H20") is None and find(hardware="cpu-local", algorithm="ppo") is None
    assert find_train_profile(tmp_path, hardware="cpu-local", model=get_model("qwen2.5-7b"), algorithm="grpo") is None
    # two torch profiles of one kind: the float32 one of the canonical name, then by name
    save_profile(_profile(dtype="bfloat16"),
                 tmp_path / profile_filename("cpu-local", "braid-tiny", "torch", "bfloat16"))
    assert find(hardware="cpu-local") == torch32


def test_fit_is_non_negative():
    x = nnls(np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]]), np.array([2.0, 4.0, 6.0]) - 1.0)  # y = -1 + 2 f
    assert np.all(x >= 0)
    fixed, eff, *_ = fit_step_time([1.0, 2.0, 3.0], [1.0, 3.0, 5.0])  # unconstrained intercept would be -1
    assert fixed == 0.0 and eff > 0
    with pytest.raises(ValueError, match="does not grow with FLOPs"):
        fit_step_time([1.0, 2.0, 3.0], [3.0, 2.0, 1.0])


def test_profile_of_another_model_is_refused_naming_both(tmp_path):
    path = save_profile(_profile(), tmp_path / "t.json")
    assert load_train_profile(path, model=TINY).model.name == "braid-tiny"
    with pytest.raises(ProfileError, match=r"t.json: profile is for model 'braid-tiny', not 'qwen2.5-7b': "
                                           r"field model.fingerprint.hidden is 128, the trained model has 3584"):
        load_train_profile(path, model=get_model("qwen2.5-7b"))


def test_bad_profile_file_names_the_field(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(save_profile(_profile(), tmp_path / "ok.json").read_text().replace('"grpo"', '"dpo"'))
    with pytest.raises(ProfileError, match=r"bad.json: field algorithm"):
        load_train_profile(path)


def test_step_time_with_a_profile_is_fixed_plus_measured_throughput_plus_communication():
    model, hw = get_model("qwen2.5-7b"), get_hardware("H800")
    prof = _profile(fixed=0.7, eff=3e14, model=model, hardware="H800")
    wl = TrainWorkload(tokens=500_000, attn_sq=2e9, mb_tokens=20_000, algorithm="grpo")
    roof, measured = TrainSite(hw, 8, 25.0), TrainSite(hw, 8, 25.0, profile=prof)
    for cfg in (ParallelConfig(dp=4, tp=4, pp=1), ParallelConfig(dp=16, tp=1, pp=1), ParallelConfig(dp=2, tp=4, pp=2)):
        a, b = step_time(model, cfg, roof, wl), step_time(model, cfg, measured, wl)
        compute = step_flops(model, wl) / (cfg.gpus * prof.effective_flops)
        assert b.compute_s == compute and b.fixed_s == prof.fixed_s and math.isclose(prof.fixed_s, 0.7)
        assert (b.tp_comm_s, b.pp_p2p_s, b.dp_comm_s) == (a.tp_comm_s, a.pp_p2p_s, a.dp_comm_s)
        assert math.isclose(b.total_s, prof.fixed_s + compute + b.tp_comm_s + b.pp_bubble_s + b.pp_p2p_s + b.dp_comm_s)
        assert math.isclose(b.pp_bubble_s,
                            (compute + b.tp_comm_s) * (cfg.pp - 1) / math.ceil(500_000 / cfg.dp / 20_000))


def test_step_time_without_a_profile_is_the_roofline():
    model, hw = get_model("qwen2.5-7b"), get_hardware("H800")
    wl = TrainWorkload(tokens=500_000, attn_sq=2e9, mb_tokens=20_000, algorithm="ppo")
    st = step_time(model, ParallelConfig(dp=8, tp=2, pp=1), TrainSite(hw, 8, 25.0), wl)
    assert st.fixed_s == 0.0 and st.compute_s == step_flops(model, wl) / (16 * hw.bf16_tflops * 1e12 * MFU)
    assert st.total_s == st.compute_s + st.tp_comm_s + st.pp_bubble_s + st.pp_p2p_s + st.dp_comm_s


def _cluster(tmp_path, extra: str, gpu: str = "cpu-local") -> str:
    path = tmp_path / "c.yaml"
    path.write_text(
        f"name: c\nsites:\n  - name: local\n    gpu: {gpu}\n    count: 4\n    gpus_per_node: 4\n    cost_per_gpu: 1.0\n"
        f"    tflops: 0.02\n    memory_gb: 4\n    memory_tb_s: 0.02\n"
        f"    profile: {PROFILE_DIR / 'cpu-local-braid-tiny.json'}\n    roles: [generation, training]\n{extra}")
    return str(path)


def test_cluster_train_profile_missing_or_mismatched_is_refused_naming_the_field(tmp_path):
    tiny_wl = str(ROOT / "deploy/workloads/tiny.yaml")
    with pytest.raises(AllocationInputError, match=r"c.yaml: sites\[0\].train_profile: no such file '.*nope.json'"):
        plan_files(_cluster(tmp_path, f"    train_profile: {tmp_path / 'nope.json'}\n"), "braid-tiny", tiny_wl)
    other = save_profile(_profile(hardware="H800"), tmp_path / "h800.json")
    with pytest.raises(AllocationInputError, match=r"train_profile: .*measured on 'H800', "
                                                   r"the site's gpu is 'cpu-local'"):
        plan_files(_cluster(tmp_path, f"    train_profile: {other}\n"), "braid-tiny", tiny_wl)


def test_allocate_uses_the_measured_profile_and_says_so(tmp_path):
    tiny_wl = str(ROOT / "deploy/workloads/tiny.yaml")
    path = save_profile(_profile(fixed=0.5, eff=1e9), tmp_path / "p.json")
    plan = plan_files(_cluster(tmp_path, f"    train_profile: {path}\n"), "braid-tiny", tiny_wl)
    roof = plan_files(_cluster(tmp_path, "    train_profile: roofline\n"), "braid-tiny", tiny_wl)
    assert plan["train_source"] == f"measured profile {path}" and roof["train_source"] == "roofline (MFU 0.40)"
    assert "training time from measured profile" in format_table(plan)
    assert plan["t_train_s"] > 0.5 and plan["t_train_s"] != roof["t_train_s"]
    assert plan["train_pad_factor"] > 1.3  # tiny.yaml's long-tailed responses, padded by the learner


def test_allocate_picks_the_shipped_profile_of_the_sites_kind_model_and_backend(tmp_path):
    tiny_wl = str(ROOT / "deploy/workloads/tiny.yaml")
    shipped = plan_files(_cluster(tmp_path, ""), "braid-tiny", tiny_wl)
    assert shipped["train_source"] == "measured profile allocator/profiles/cpu-local-braid-tiny-train.json"
    named = plan_files(_cluster(tmp_path, f"    train_profile: {PROFILE_DIR / 'cpu-local-braid-tiny-train.json'}\n"),
                       "braid-tiny", tiny_wl)
    assert named["t_train_s"] == shipped["t_train_s"]
    # no megatron profile of braid-tiny on cpu-local: the roofline
    mega = plan_files(_cluster(tmp_path, "    train_backend: megatron\n"), "braid-tiny", tiny_wl)
    assert mega["train_source"] == "roofline (MFU 0.40)"
    other = save_profile(_profile(), tmp_path / "torch.json")
    with pytest.raises(AllocationInputError, match=r"train_profile: .*torch.json was measured on the torch backend, "
                                                   r"the site trains with train_backend 'megatron'"):
        plan_files(_cluster(tmp_path, f"    train_profile: {other}\n    train_backend: megatron\n"),
                   "braid-tiny", tiny_wl)


@pytest.mark.parametrize("path", sorted(PROFILE_DIR.glob("*-train.json")), ids=lambda p: p.stem)
def test_every_shipped_train_profile_loads_and_fits_its_points(path):
    prof = load_train_profile(path)
    load_train_profile(path, model=get_model(prof.model.name))
    assert "MEASURED" in prof.notes and prof.fit_median_rel_error <= prof.fit_max_rel_error < 0.5
    for pt in prof.points:
        predicted = prof.seconds(padded_step_flops(get_model(prof.model.name), pt.workload(prof.algorithm)))
        assert abs(predicted - pt.seconds) / pt.seconds <= prof.fit_max_rel_error + 1e-9


def test_profiler_response_lengths_equal_or_at_lognormal_quantiles():
    import random
    import statistics

    from allocator.train_profiler import response_lengths

    assert response_lengths(8, 16, 0.0, 192, random.Random(0)) == [16] * 8
    spread = response_lengths(64, 16, 0.8, 100, random.Random(0))
    assert len(spread) == 64 and 14 <= statistics.median(spread) <= 18 and max(spread) <= 100 and min(spread) >= 1
    assert sorted(spread) == sorted(response_lengths(64, 16, 0.8, 100, random.Random(1)))  # quantiles, not draws
