"""A real run whose growing forced lengths force a scale-out: the controller starts one more SGS
instance process, the router takes it in, no sample is lost or duplicated, the run finishes."""

from __future__ import annotations

import json

import pytest

from tests.conftest import FAST_ENGINE, ROOT

# `make test-long` (CI runs it): too long for the 15-minute fast tier (docs/testing.md)
pytestmark = pytest.mark.long


def test_growing_lengths_force_a_scale_out(tmp_path, tiny_checkpoint):
    from flows.launcher import run_processes
    from services.common.config import load_config, write_config

    cfg = load_config(ROOT / "deploy/configs/smoke.yaml", [FAST_ENGINE,
        "trainer.mode=one_step", "trainer.iterations=12", "eval.prompts=4", "generation.max_new_tokens=128",
        "generation.forced_lengths=true", "generation.max_inflight=2", "forced_length_ramp.start=24",
        "forced_length_ramp.per_iteration=8", "generation.dispatch.policy=least_loaded", "weights.transport=direct",
        "scaleout.enabled=true", "scaleout.max_instances=2", "scaleout.window=1", "scaleout.cooldown=1",
        "scaleout.scale_in=false",
    ])
    write_config(cfg, tmp_path / "config.json")
    summary = json.loads(run_processes(tmp_path, str(tiny_checkpoint)).read_text())
    assert summary["final_weight_version"] == cfg.trainer.iterations  # the run finished, every step taken

    events = [json.loads(x) for x in (tmp_path / "scaleout.jsonl").read_text().splitlines()]
    decisions = [e for e in events if e["event"] == "decision"]
    assert [d["iteration"] for d in decisions] == list(range(cfg.trainer.iterations))
    outs = [e for e in events if e["event"] == "scale_out"]
    assert len(outs) == 1 and outs[0]["instances"] == 2  # one more instance, then held at max_instances
    assert decisions[outs[0]["iteration"]]["action"] == "out"

    router = [json.loads(x) for x in (tmp_path / "router-timeline.jsonl").read_text().splitlines()]
    added = [e for e in router if e["event"] == "add_instance"]
    assert len(added) == 1 and len(added[0]["instances"]) == 2 and added[0]["address"] == outs[0]["address"]
    assert not [e for e in router if e["event"] == "remove_instance"]
    assert any(e["event"] == "sample" and e["instance"] == added[0]["slot"] for e in router)  # it served prompts

    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    per_iteration = cfg.trainer.prompts_per_iteration * cfg.trainer.group_size
    assert [r["samples"] for r in rows] == [per_iteration] * cfg.trainer.iterations  # none lost or duplicated
    assert ([r["response_len_max"] for r in rows]
            == [cfg.forced_length_ramp.length(k) for k in range(cfg.trainer.iterations)])
    sample_keys = [(e["call"], e["seq"]) for e in router if e["event"] == "sample"]
    assert len(sample_keys) == len(set(sample_keys))


def test_generation_far_ahead_scales_in_without_losing_work(tmp_path):
    """Two instances, one-token forced outputs and a trainer with real work per sample (a model
    larger than the smoke one, a KL term): generation runs far ahead, the controller removes the
    newer instance (drained through the router, its process stopped), and every iteration still
    gets all its samples exactly once."""
    from flows.launcher import run_processes
    from services.common.config import load_config, write_config
    from services.policy.model import build_policy, save_policy

    cfg = load_config(ROOT / "deploy/configs/smoke.yaml", [FAST_ENGINE,
        "model.hidden_size=128", "model.num_layers=4", "model.intermediate_size=256",
        "trainer.mode=one_step", "trainer.iterations=40", "eval.prompts=4", "generation.instances=2",
        "generation.forced_lengths=true", "forced_length_ramp.start=1", "generation.dispatch.policy=least_loaded",
        "weights.transport=direct", "trainer.kl_coef=0.001", "scaleout.enabled=true", "scaleout.min_instances=1",
        "scaleout.max_instances=2", "scaleout.window=1", "scaleout.cooldown=1", "scaleout.scale_in=true",
    ])
    write_config(cfg, tmp_path / "config.json")
    save_policy(build_policy(cfg.model), tmp_path / "policy")
    summary = json.loads(run_processes(tmp_path, str(tmp_path / "policy")).read_text())
    assert summary["final_weight_version"] == cfg.trainer.iterations

    events = [json.loads(x) for x in (tmp_path / "scaleout.jsonl").read_text().splitlines()]
    ins = [e for e in events if e["event"] == "scale_in"]
    assert len(ins) == 1 and ins[0]["instances"] == 1, events  # down to min_instances, then held
    assert not [e for e in events if e["event"] == "scale_out"]
    decision = next(e for e in events if e["event"] == "decision" and e["iteration"] == ins[0]["iteration"])
    assert decision["action"] == "in" and decision["t_train_s"] > decision["t_gen_s"], decision

    router = [json.loads(x) for x in (tmp_path / "router-timeline.jsonl").read_text().splitlines()]
    removed = [e for e in router if e["event"] == "remove_instance"]
    assert len(removed) == 1 and removed[0]["address"] == ins[0]["address"]
    # no work for it after it left: dispatches planned after the removal (both timestamps are taken under
    # the router's membership lock) give its slot nothing; calls planned before it may still finish there
    later = {e["call"] for e in router if e["event"] == "dispatch" and e["t"] > removed[0]["t"]}
    assert later and all(e["per_instance"][removed[0]["slot"]] == 0 for e in router
                         if e["event"] == "dispatch" and e["call"] in later)
    assert all(e["instance"] != removed[0]["slot"] for e in router if e["event"] == "sample" and e["call"] in later)

    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    per_iteration = cfg.trainer.prompts_per_iteration * cfg.trainer.group_size
    assert [r["samples"] for r in rows] == [per_iteration] * cfg.trainer.iterations  # none lost or duplicated
