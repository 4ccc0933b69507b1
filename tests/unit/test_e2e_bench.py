"""Pure helpers of the end-to-end benchmark (bench/e2e.py, bench/trl_peer.py): no TRL, no runs."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


e2e = _load("e2e")
core = _load("e2e_core")
e2e_report = _load("e2e_report")
trl_peer = _load("trl_peer")


def row(k: int, samples: int = 256, t: float = 2.0, mean: float = 0.0, mx: int = 0, **extra) -> dict:
    return {"iteration": k, "samples": samples, "iteration_time_s": t, "staleness_mean": mean, "staleness_max": mx,
            **extra}


def test_steady_throughput_excludes_the_first_iteration():
    rows = [row(0, t=10.0), row(1, t=2.0), row(2, t=2.0)]
    got = core.steady_throughput(rows)
    assert got["samples_per_s"] == pytest.approx(512 / 4.0)
    assert got["iterations_counted"] == 2
    assert core.steady_throughput([row(0, t=4.0)])["samples_per_s"] == pytest.approx(64.0)
    assert got["tokens_per_s"] is None  # no response lengths recorded (as in TRL's rows)
    with_len = [row(0, t=10.0), row(1, t=2.0, response_len_mean=10.0), row(2, t=2.0, response_len_mean=30.0)]
    assert core.steady_throughput(with_len)["tokens_per_s"] == pytest.approx((2560 + 7680) / 4.0)
    with pytest.raises(ValueError):
        core.steady_throughput([])


def test_curve_starts_at_the_warm_start_and_is_relative_to_rl_start():
    points = [{"time": 130.0, "accuracy": 0.5, "stderr": 0.02}, {"time": 110.0, "accuracy": 0.4, "stderr": 0.02}]
    assert core.curve_points((0.3, 0.02), points, 100.0) == [[0.0, 0.3, 0.02], [10.0, 0.4, 0.02], [30.0, 0.5, 0.02]]


def test_time_to_target_is_the_first_checkpoint_reaching_it():
    curve = [[0.0, 0.30, 0.02], [10.0, 0.36, 0.02], [20.0, 0.33, 0.02], [30.0, 0.40, 0.02]]
    assert core.time_to_target(curve, 0.35) == 10.0
    assert core.time_to_target(curve, 0.40) == 30.0
    assert core.time_to_target(curve, 0.30) == 0.0
    assert core.time_to_target(curve, 0.41) is None
    assert core.time_to_target(curve, None) is None


def test_target_rule():
    assert core.choose_target(0.30, 0.50) == pytest.approx(0.30 + core.TARGET_FRACTION * 0.20)
    assert core.choose_target(0.30, 0.30) is None  # no gain: no meaningful target
    assert core.choose_target(0.30, None) is None


def test_mode_overrides_and_bounds():
    assert core.mode_overrides("sync", 2) == ["trainer.mode=sync", "generation.instances=2"]
    assert core.mode_overrides("bounded_4_partial", 2) == [
        "trainer.mode=bounded", "trainer.eta=4", "generation.instances=2", "trainer.partial_rollout=true",
    ]
    assert core.staleness_bound("one_step") == 1 and core.staleness_bound("bounded_2_partial") == 2
    assert core.mode_overrides("bounded_2_staleflow", 2)[-1] == "trainer.coordination.policy=staleflow"
    assert core.staleness_bound("bounded_2_staleflow") == 2
    for bad in ("bounded", "bounded_x", "bounded_2_full", "async"):
        with pytest.raises(ValueError):
            core.mode_overrides(bad, 2)


def test_every_mode_name_resolves_to_a_valid_config():
    from services.common.config import load_config

    for mode in core.MODES:
        load_config(None, core.mode_overrides(mode, 2))


def test_buffer_staleness_from_bounded_histograms_and_from_one_step_means():
    bounded = [row(0, mean=0.5, mx=2, entry_staleness_hist={"0": 16, "2": 16}, bound_violations=0)]
    (b,) = core.buffer_staleness(bounded, 8, bound=2)
    assert b["hist"] == {"0": 16, "2": 16} and b["violations"] == 0
    (b,) = core.buffer_staleness(bounded, 8, bound=1)
    assert b["violations"] == 16  # groups staler than the bound are counted
    one_step = [row(0, mean=0.0), row(1, mean=1.0, mx=1), row(2, mean=0.25, mx=1)]
    buffers = core.buffer_staleness(one_step, 8, bound=1)
    assert [b["hist"] for b in buffers] == [{"0": 32}, {"1": 32}, {"0": 24, "1": 8}]
    assert core.total_hist(buffers) == {"0": 56, "1": 40}
    (b,) = core.buffer_staleness([row(0, mean=0.5, mx=1)], 8, bound=0)
    assert b["violations"] > 0  # a stale sample in sync mode is a violation


def _ok(sps: float, acc: float = 0.5, violations: int = 0) -> dict:
    return {"status": "ok", "samples_per_s": sps, "final_accuracy": acc, "accuracy_stderr": 0.02,
            "curve": [[0.0, 0.3, 0.02], [50.0, acc, 0.02]], "staleness": {"violations": violations}}


def test_assemble_has_the_issue_fields_for_every_mode_and_survives_failures():
    per_mode = {
        "sync": _ok(50.0), "one_step": _ok(70.0, violations=0), "bounded_2": _ok(80.0),
        "bounded_4": {"status": "failed: RuntimeError: boom"}, "trl": _ok(25.0),
    }
    modes = list(per_mode)
    result = core.assemble(modes, per_mode, 0.45, {"settings": {}})
    for name in ("samples_per_s", "time_to_target_s", "final_accuracy", "accuracy_stderr"):
        assert set(result[name]) >= {"sync", "one_step", "bounded_1", "bounded_2", "bounded_4", "trl"}
        assert set(result[name]) == set(core.MODES)
    assert result["samples_per_s"]["bounded_4"] is None and result["status"]["bounded_4"].startswith("failed")
    assert result["samples_per_s"]["bounded_1"] is None and result["status"]["bounded_1"] == "not run"
    assert result["time_to_target_s"]["sync"] == 50.0
    assert result["max_staleness_violations"] == 0
    t = result["targets"]
    assert t["one_step_ge_1.25x_sync"] is True and t["bounded_2_ge_one_step"] is True
    assert t["every_braid_mode_ahead_of_trl"] is True
    assert t["async_noninferior_to_sync"] is None  # no paired evaluation given
    assert "noninferiority" not in result


def test_assemble_reports_the_noninferiority_test():
    per_mode = {"sync": _ok(50.0), "one_step": _ok(70.0), "bounded_2": _ok(80.0)}
    conv = {"sync_gain_se": 6.0, "negative_control_flagged": True, "margin": 0.01,
            "noninferiority": {"one_step": {"verdict": "non-inferior"}, "bounded_2": {"verdict": "inconclusive"}},
            "negative_control": {"untrained": {"verdict": "inferior"}, "placebo": {"verdict": "inconclusive"}}}
    result = core.assemble(list(per_mode), per_mode, 0.45, {}, conv)
    assert result["negative_control_verdict"] == "inconclusive"  # the declared control's own, not the untrained's
    assert result["targets"]["async_noninferior_to_sync"] == {"one_step": True, "bounded_2": False}
    assert result["sync_gain_se"] == 6.0 and result["negative_control_flagged"] is True
    assert result["noninferiority"]["bounded_2"]["verdict"] == "inconclusive"
    assert result["convergence"]["margin"] == 0.01 and "noninferiority" not in result["convergence"]


def test_the_placebo_control_is_sync_at_a_learning_rate_that_moves_nothing():
    over = core.mode_overrides(core.PLACEBO, 2)
    assert over == ["trainer.mode=sync", "trainer.lr=1e-09", "generation.instances=2"]
    assert core.staleness_bound(core.PLACEBO) == 0 and core.NEGATIVE_CONTROL_EXPECTED == "inferior"
    from services.common.config import RunConfig, apply_overrides

    assert RunConfig.model_validate(apply_overrides({}, over)).trainer.lr == 1e-9


def test_the_partial_harm_control_is_sync_with_most_groups_on_shuffled_rewards():
    over = core.mode_overrides(core.PARTIAL_HARM, 2)
    assert over == ["trainer.mode=sync", "reward.shuffle_fraction=0.75", "generation.instances=2"]
    assert core.staleness_bound(core.PARTIAL_HARM) == 0
    # declared before the run, beside the placebo, and both run by default
    assert core.CONTROLS_EXPECTED == {core.PLACEBO: "inferior", core.PARTIAL_HARM: "inferior"}
    assert core.DEFAULT_CONTROLS == (core.PLACEBO, core.PARTIAL_HARM)
    from services.common.config import RunConfig, apply_overrides

    cfg = RunConfig.model_validate(apply_overrides({}, over))
    assert cfg.trainer.mode == "sync" and cfg.reward.shuffle_fraction == 0.75 and cfg.trainer.lr > 1e-6


def test_a_declared_control_judged_noninferior_is_reported_as_failed():
    """partial_harm declared inferior but as good as sync: the check fails, in the JSON and in e2e.md."""
    import random

    stats = _load("e2e_stats")
    rng = random.Random(0)
    n = 3000
    base = [rng.betavariate(1.0, 1.5) for _ in range(n)]
    warm = [float(rng.random() < p) for p in base]
    sync = [float(rng.random() < min(1.0, p + 0.1)) for p in base]
    harm = [0.0 if i % 100 == 0 else x for i, x in enumerate(sync)]  # sync's scores, a few prompts lost
    conv = stats.convergence(warm, sync, {}, {"untrained": warm, core.PLACEBO: warm, core.PARTIAL_HARM: harm},
                             expected=dict(core.CONTROLS_EXPECTED))
    assert conv["powered"] and conv["negative_control"][core.PARTIAL_HARM]["verdict"] == "non-inferior"
    assert conv["declared_controls"][core.PLACEBO]["met"] is True
    assert conv["declared_controls"][core.PARTIAL_HARM] | {"diff": 0, "ci95": 0} == {
        "expected": "inferior", "verdict": "non-inferior", "met": False, "diff": 0, "ci95": 0}
    assert conv["declared_controls_met"] is False
    per_mode = {"sync": _ok(50.0), core.PLACEBO: _ok(50.0), core.PARTIAL_HARM: _ok(50.0)}
    meta = {"settings": {"quick": False, "iterations": 100, "checkpoint_every": 10, "eval_prompts": 500,
                         "samples_per_iteration": 256, "decoding": "sampling", "trl_generation": "cb", "instances": 2,
                         "trl_threads": 2, "paired_prompts": n, "paired_samples": 1},
            "host": {"summary": "x86_64, 2 cores", "trl_version": None},
            "target_rule": "rule", "warmstart": {"accuracy": 0.3, "stderr": 0.03}}
    result = core.assemble(list(per_mode), per_mode, 0.4, meta, conv)
    assert result["declared_controls_met"] is False and result["negative_control_verdict"] == "inferior"
    text = e2e_report.markdown(result)
    assert "(all met: **False**)" in text
    assert "- placebo (sync at lr 1e-09: every step taken, nothing learned): **inferior** (" in text
    line = next(x for x in text.splitlines() if x.startswith("- partial_harm ("))
    assert "**non-inferior**" in line and line.endswith("must be inferior: **FAILED**")
    assert "| partial_harm (negative control) |" in text


def test_a_declared_control_that_did_not_run_has_not_met_its_declaration():
    stats = _load("e2e_stats")
    warm, sync = [0.0, 0.25, 0.5, 0.0], [0.5, 0.5, 0.75, 0.5]
    conv = stats.convergence(warm, sync, {}, {"untrained": warm}, expected={core.PARTIAL_HARM: "inferior"})
    assert conv["declared_controls"][core.PARTIAL_HARM]["met"] is False
    assert conv["declared_controls"][core.PARTIAL_HARM]["verdict"] is None and conv["declared_controls_met"] is False
    assert stats.convergence(warm, sync, {}, {"untrained": warm})["declared_controls_met"] is None


def test_assemble_counts_violations_and_misses():
    per_mode = {"sync": _ok(50.0), "one_step": _ok(55.0, violations=3), "trl": _ok(60.0)}
    result = core.assemble(list(per_mode), per_mode, None, {})
    assert result["max_staleness_violations"] == 3
    assert result["time_to_target_s"]["sync"] is None  # no target
    assert result["targets"]["one_step_ge_1.25x_sync"] is False
    assert result["targets"]["every_braid_mode_ahead_of_trl"] is False
    assert result["targets"]["bounded_2_ge_one_step"] is None


def test_markdown_renders_a_partial_result():
    per_mode = {"sync": _ok(50.0), "trl": {"status": "failed: RuntimeError: TRL peer exited with code 1\nlog"}}
    per_mode["sync"]["staleness"]["total_hist"] = {"0": 64}
    meta = {
        "settings": {"quick": True, "iterations": 6, "checkpoint_every": 2, "eval_prompts": 200,
                     "samples_per_iteration": 256, "decoding": "sampling", "trl_generation": "cb",
                     "instances": 2, "trl_threads": 2},
        "host": {"summary": "x86_64, 2 cores", "trl_version": None},
        "target_rule": "rule", "warmstart": {"accuracy": 0.3, "stderr": 0.03},
    }
    per_mode["sync"].update(tokens_per_s=1500.0, started_at=1795475229.0)
    text = e2e_report.markdown(core.assemble(["sync", "trl"], per_mode, 0.4, meta))
    assert "| sync | 50.0 | 1.00x | — | 1500 | 1.00x |" in text and "| 11-23 23:07 |" in text
    assert "| trl | — |" in text and "failed: RuntimeError" in text


def test_repeats_average_throughput_add_violations_and_render_with_stderr():
    first = {**_ok(80.0, violations=0), "tokens_per_s": 2400.0, "run_dir": "a"}
    reps = [{"status": "ok", "samples_per_s": 90.0, "tokens_per_s": 2600.0, "run_dir": "b",
             "staleness": {"bound": 1, "violations": 0}},
            {"status": "ok", "samples_per_s": 100.0, "tokens_per_s": 2800.0, "run_dir": "c",
             "staleness": {"bound": 1, "violations": 2}}]
    out = core.combine_repeats(first, reps)
    assert out["samples_per_s"] == pytest.approx(90.0) and out["tokens_per_s"] == pytest.approx(2600.0)
    assert out["samples_per_s_stderr"] == pytest.approx(10.0 / math.sqrt(3))  # sample s.d. 10 over sqrt(3)
    assert [r["run_dir"] for r in out["runs"]] == ["a", "b", "c"]
    assert out["staleness"]["violations"] == 2 and out["final_accuracy"] == first["final_accuracy"]
    assert core.repeat_overrides(0) == [] and core.repeat_overrides(2) == ["generation.seed=2"]

    sync = core.combine_repeats({**_ok(60.0), "run_dir": "s"}, [{**_ok(60.0), "run_dir": "t"}])
    result = core.assemble(["sync", "one_step"], {"sync": sync, "one_step": out}, None, {})
    assert result["samples_per_s"]["one_step"] == pytest.approx(90.0)
    assert e2e_report.ratio_with_stderr(result, "one_step", "sync") == "1.50x ± 0.10"
    assert e2e_report.with_stderr(out, "samples_per_s", ".1f") == "90.0 ± 5.8 (3 runs)"
    assert e2e_report.with_stderr(first, "samples_per_s", ".1f") == "80.0"


def test_trl_peer_batching_gives_one_step_per_iteration():
    assert trl_peer.peer_batching(256, 8, 64) == (64, 4)
    assert trl_peer.peer_batching(64, 8, 128) == (64, 1)
    with pytest.raises(ValueError):
        trl_peer.peer_batching(256, 8, 48)
    with pytest.raises(ValueError):
        trl_peer.peer_batching(100, 8, 50)
    assert math.isfinite(core.TARGET_FRACTION)


def test_trl_peer_takes_the_learning_problem_from_the_run_config(tmp_path):
    """GRPOConfig's arguments mirror the config a Braid run trains with (the module docstring's list)."""
    from services.common.config import load_config

    cfg = load_config(BENCH.parent / "deploy/configs/default.yaml", ["trainer.kl_coef=0.04", "trainer.lr=3e-5"])
    tc, gc = cfg.trainer, cfg.generation
    plain = trl_peer.grpo_settings(cfg, "generate", tmp_path / "out", 64, 4)
    assert (plain["beta"], plain["epsilon"], plain["learning_rate"]) == (0.04, tc.clip_eps, 3e-5)
    assert (plain["num_generations"], plain["max_steps"], plain["seed"]) == (tc.group_size, tc.iterations, tc.seed)
    assert (plain["max_completion_length"], plain["temperature"]) == (gc.max_new_tokens, gc.temperature)
    assert (plain["per_device_train_batch_size"], plain["gradient_accumulation_steps"]) == (64, 4)
    assert plain["max_grad_norm"] == tc.max_grad_norm and plain["weight_decay"] == tc.weight_decay
    assert (plain["top_k"], plain["top_p"], plain["shuffle_dataset"], plain["loss_type"]) == (0, 1.0, False, "grpo")
    assert plain["output_dir"] == str(tmp_path / "out") and plain["use_cpu"] and not plain["use_vllm"]
    assert not plain["use_transformers_continuous_batching"]
    assert plain["transformers_continuous_batching_config"] is None
    cb = trl_peer.grpo_settings(cfg, "cb", tmp_path / "out", 64, 4)
    assert cb["use_transformers_continuous_batching"]
    assert cb["transformers_continuous_batching_config"] == {
        "num_blocks": gc.num_blocks, "page_size": gc.page_size, "max_batch_tokens": gc.max_batch_tokens,
        "allow_block_sharing": False}


def _verdicts(steps, iterations=100, commit="abc1234"):
    return {"settings": {"warmstart_steps": steps, "iterations": iterations},
            "warmstart": {"accuracy": 0.3, "stderr": 0.02}, "sync_gain_se": 10.0,
            "noninferiority": {"one_step": {"diff": -0.006, "verdict": "inconclusive"}},
            "provenance": {"commit": commit, "date": "2026-11-25"}}


def test_a_new_regime_keeps_the_old_verdicts_beside_and_the_same_regime_keeps_the_oldest(tmp_path):
    import json

    old = tmp_path / "e2e.json"
    old.write_text(json.dumps(_verdicts(None)))  # written before warmstart_steps was recorded
    new = _verdicts(275, commit="def5678")
    e2e.carry_previous_regime(new, old)
    prev = new["previous_regime"]
    assert prev["regime"] == {"warmstart_steps": None, "iterations": 100, "paired_samples": None}
    assert prev["noninferiority"]["one_step"]["verdict"] == "inconclusive"
    assert prev["provenance"]["commit"] == "abc1234"
    text = "\n".join(e2e_report.previous_regime_lines(new))
    assert "the config's own SFT steps" in text and "one_step inconclusive (-0.0060)" in text

    old.write_text(json.dumps(new))  # a re-run of the same regime keeps the oldest verdicts beside
    again = _verdicts(275, commit="0123abc")
    e2e.carry_previous_regime(again, old)
    assert again["previous_regime"]["provenance"]["commit"] == "abc1234"

    old.write_text(json.dumps({"settings": {"warmstart_steps": 275}}))  # a file without verdicts: nothing to keep
    fresh = _verdicts(275)
    e2e.carry_previous_regime(fresh, old)
    assert "previous_regime" not in fresh and e2e_report.previous_regime_lines(fresh) == []

    old.write_text(json.dumps(_verdicts(275) | {"settings": {"warmstart_steps": 275, "iterations": 100,
                                                              "paired_samples": 4}}))
    more = _verdicts(275) | {"settings": {"warmstart_steps": 275, "iterations": 100, "paired_samples": 8}}
    e2e.carry_previous_regime(more, old)  # more paired samples: another power, so the old verdicts stay beside
    assert more["previous_regime"]["regime"]["paired_samples"] == 4
    assert "4 paired samples a prompt" in "\n".join(e2e_report.previous_regime_lines(more))
