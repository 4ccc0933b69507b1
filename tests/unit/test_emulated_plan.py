"""An allocation plan as an EMULATED fleet (``flows.emulated_plan``): the planner's numbers become
the run's config; pure (profiles and cluster files are read, nothing starts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.emulated_plan import config_workload, emulated_overrides, plan_for_run
from flows.rl_training import plan_overrides
from services.common.config import ConfigError, load_config
from services.generation.emulated_engine import resolve_profile
from services.generation.scheduling.models import get_model

ROOT = Path(__file__).resolve().parents[2]
EMULATED = ROOT / "deploy/configs/emulated.yaml"
CLUSTER = str(ROOT / "deploy/clusters/emulated-32xH20-8xH800.yaml")


def test_the_runs_own_iteration_is_the_workload_the_plan_is_made_for():
    cfg = load_config(EMULATED)
    wl = config_workload(cfg)
    assert wl.batch_size == cfg.trainer.prompts_per_iteration * cfg.trainer.group_size
    emu = cfg.generation.emulation.lengths
    ln = wl.response_tokens.lognormal
    assert (ln.median, ln.sigma, ln.max) == (emu.median, emu.sigma, cfg.generation.max_new_tokens)
    fixed = config_workload(load_config(EMULATED, ["generation.emulation.lengths={distribution: fixed, tokens: 99}"]))
    assert fixed.response_tokens.samples == [99]


def test_a_plan_becomes_the_emulated_fleet_it_describes():
    cfg = load_config(EMULATED)
    plan = plan_for_run(cfg, CLUSTER)
    assert plan["gen_instances"] == 32 and plan["gen_kind"] == "H20" and plan["train_kind"] == "H800"
    run = load_config(EMULATED, plan_overrides(plan, cfg))
    gen, emu = run.generation, run.trainer.emulation
    assert gen.instances == 32
    profile = resolve_profile(gen.emulation.profile)
    assert profile.hardware == "H20" and gen.max_inflight == profile.max_batch
    assert gen.num_blocks * gen.page_size >= profile.kv_capacity_tokens
    # the declared model's bytes over the 80 Gbps link, after one read of them at HBM bandwidth
    wire = get_model("qwen2.5-7b").weight_bytes() * 8 / 80e9
    assert gen.emulation.reload_s == pytest.approx(profile.step_cost.k2 + wire)
    assert (emu.gpu, emu.gpus, emu.model) == ("H800", plan["train_gpus"], "qwen2.5-7b")
    assert emu.parallel.replace("-", "x").upper() == plan["train_parallel"].upper()


def test_a_larger_tensor_parallel_instance_is_derived_at_its_degree():
    plan = plan_for_run(load_config(EMULATED), str(ROOT / "deploy/clusters/cross-site-32xH20-128xH800.yaml"))
    tp = plan["emulation"]["gen_tensor_parallel"]
    assert plan["gen_gpus"] == plan["gen_instances"] * tp
    if tp > 1:
        assert plan["emulation"]["gen_profile"] == f"H20:qwen2.5-7b:tp{tp}"
        assert resolve_profile(plan["emulation"]["gen_profile"]).tensor_parallel == tp


def test_a_given_allocation_is_priced_and_emulated_as_a_plan_is():
    from allocator.allocate import allocation_specs, find_model
    from allocator.cluster import AllocationInputError, load_cluster

    cfg, cross = load_config(EMULATED), str(ROOT / "deploy/clusters/cross-site-32xH20-128xH800.yaml")
    plan = plan_for_run(cfg, cross)
    args = (load_cluster(cross), cross, find_model("qwen2.5-7b"), config_workload(cfg))
    same = allocation_specs(*args, plan["gen_gpus"], plan["train_gpus"])
    for key in ("iteration_s", "t_gen_s", "t_train_s", "gen_instances", "train_parallel", "emulation",
                "cross_site_weight_transfer_s"):
        assert same[key] == plan[key], key
    even = allocation_specs(*args, 20, 20)
    assert even["gen_gpus"] == 20 and even["train_gpus"] == 20 and even["objective"] == "given"
    assert even["gen_instances"] * even["emulation"]["gen_tensor_parallel"] == 20
    assert even["iteration_s"] >= plan["iteration_s"]  # the planner's full generation side is never slower
    run = load_config(EMULATED, emulated_overrides(even, cfg.generation.page_size))
    assert run.generation.instances == even["gen_instances"] and run.trainer.emulation.gpus == 20
    # weights.delta: the declared 7B model's version crosses the 80 Gbit/s link as a delta, codec included
    whole_s, delta_s = even["cross_site_weight_transfer_s"], even["cross_site_delta_transfer_s"]
    assert delta_s == pytest.approx(whole_s * 0.036 + whole_s * 80e9 / 8 / 168e6)
    with_delta = load_config(EMULATED, emulated_overrides(even, cfg.generation.page_size, delta=True))
    assert with_delta.generation.emulation.reload_s - run.generation.emulation.reload_s == pytest.approx(
        delta_s - whole_s)
    with pytest.raises(AllocationInputError, match="outside the sites' budgets"):
        allocation_specs(*args, 40, 8)


def test_only_an_emulated_run_is_planned_and_a_plan_without_emulation_is_refused():
    with pytest.raises(ConfigError, match="EMULATED run"):
        plan_for_run(load_config(ROOT / "deploy/configs/default.yaml"), CLUSTER)
    with pytest.raises(ConfigError, match=r"trainer\.emulation\.model"):
        plan_for_run(load_config(EMULATED, ["trainer.emulation={gpu: H800}"]), CLUSTER)
    old = {k: v for k, v in plan_for_run(load_config(EMULATED), CLUSTER).items() if k != "emulation"}
    with pytest.raises(ConfigError, match="predates emulation"):
        emulated_overrides(old, 32)
    with pytest.raises(ConfigError, match="no such cluster file"):
        plan_for_run(load_config(EMULATED), "nope.yaml")


def test_more_than_64_instances_and_a_scale_out_past_64_are_an_emulated_fleets_only():
    big = ["scaleout.enabled=true", "scaleout.min_instances=32", "scaleout.max_instances=256"]
    assert load_config(EMULATED, big).scaleout.max_instances == 256
    with pytest.raises(ConfigError, match=r"scaleout\.max_instances 256: more than 64 instances run on the emulated"):
        load_config(ROOT / "deploy/configs/default.yaml", [*big, "generation.instances=32"])
    with pytest.raises(ConfigError, match=r"generation\.instances 65: more than 64"):
        load_config(ROOT / "deploy/configs/default.yaml", ["generation.instances=65"])
