"""bench/trl_fair.py's pure part (bench/trl_fair_core.py): settings matching, TRL's resolved config check, the steady
rates (one definition for both systems), target and time-to-target, paired ratios, e2e.json update."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
for _p in (ROOT, ROOT / "bench"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import trl_fair  # noqa: E402
import trl_fair_core as tf  # noqa: E402
import trl_fair_report as tfr  # noqa: E402
from e2e_core import pin_overrides  # noqa: E402

from bench.report_io import set_json_key  # noqa: E402
from services.common.config import load_config  # noqa: E402

TRL = {"micro_batch": 64, "threads": 2, "generation": "generate", "prompt_tokens": 19}


def _cfg(*extra: str) -> dict:
    blocks = tf.static_batch_blocks(256, 19, 192, 32)
    over = tf.shared_overrides(30, 10, 500, blocks) + pin_overrides(True) + list(extra)
    return load_config(trl_fair.CONFIG, over).model_dump(mode="json")


def test_static_batch_blocks_hold_a_whole_step():
    assert tf.static_batch_blocks(256, 19, 192, 32) == 1688  # ceil(256 * 211 / 32)
    assert tf.static_batch_blocks(1, 1, 31, 32) == 1


def test_the_shared_config_is_matched_and_says_what_is_matched():
    m = tf.matched_settings(_cfg(), TRL)
    assert m["samples_per_step"] == 256 and m["micro_batch_completions"] == 64
    assert m["cores"] == 2 and m["braid_pinning"]["sgs_cpus"] == [0] and m["braid_pinning"]["trainer_cpus"] == [1]
    assert m["temperature"] == 1.0 and m["iterations"] == 30 and m["checkpoint_every"] == 10
    assert "hf" in m["generation"] and "generate" in m["generation"]


@pytest.mark.parametrize(("extra", "trl", "needle"), [
    (["generation.engine=vllm"], {}, "generation"),
    (["trainer.skip_zero_advantage_groups=true"], {}, "zero-advantage"),
    (["trainer.mode=one_step"], {}, "trainer.mode"),
    ([], {"micro_batch": 32}, "micro batch"),
    ([], {"generation": "cb"}, "generation"),
    ([], {"threads": 1}, "cores"),
    (["trainer.threads=2"], {}, "cores"),
    (["generation.num_blocks=512"], {}, "static batch"),
    (["generation.instances=2"], {}, "SGS instance"),
])
def test_every_unmatched_setting_is_refused(extra, trl, needle):
    with pytest.raises(ValueError, match=needle):
        tf.matched_settings(_cfg(*extra), {**TRL, **trl})


def _grpo(**over) -> dict:
    base = {"num_generations": 8, "max_completion_length": 192, "temperature": 1.0, "learning_rate": 1e-4,
            "lr_scheduler_type": "SchedulerType.CONSTANT", "beta": 0.0, "epsilon": 0.2, "loss_type": "grpo",
            "scale_rewards": "group", "max_grad_norm": 1.0, "per_device_train_batch_size": 64,
            "gradient_accumulation_steps": 4, "generation_batch_size": 256}
    return {**base, **over}


def test_trl_resolved_config_is_checked_against_the_run_config():
    cfg = _cfg()
    assert tf.trl_mismatches(_grpo(), cfg, 64) == []
    assert tf.trl_mismatches(_grpo(lr_scheduler_type="constant"), cfg, 64) == []
    bad = tf.trl_mismatches(_grpo(learning_rate=1e-3, gradient_accumulation_steps=2), cfg, 64)
    assert any("learning_rate" in b for b in bad) and any("optimizer step" in b for b in bad)
    assert any("beta" in b for b in tf.trl_mismatches(_grpo(beta=0.04), cfg, 64))


def _rows(ends, lens, samples=256):
    return [{"iteration": i, "t_end": t, "samples": samples, "response_len_mean": n}
            for i, (t, n) in enumerate(zip(ends, lens, strict=True))]


def test_steady_rates_exclude_step_zero_and_count_wall_between_step_ends():
    rows = _rows([100.0, 110.0, 115.0, 125.0], [999.0, 10.0, 20.0, 30.0])
    r = tf.steady_rates(list(reversed(rows)))  # order of the rows does not matter
    assert r["wall_s"] == 25.0 and r["samples"] == 768 and r["steps_counted"] == 3
    assert r["samples_per_s"] == pytest.approx(768 / 25)
    assert r["tokens_per_s"] == pytest.approx(256 * 60 / 25)  # step 0's 999-token mean is not counted
    assert r["response_len_mean"] == pytest.approx(20.0)
    with pytest.raises(ValueError):
        tf.steady_rates(rows[:1])


def test_trl_lengths_join_by_step_and_refuse_a_missing_one():
    rows = [{"iteration": 0, "t_end": 1.0, "samples": 256}, {"iteration": 1, "t_end": 2.0, "samples": 256}]
    logs = [{"step": 2, "completions/mean_length": 12.5}, {"step": 1, "completions/mean_length": 30.0}]
    joined = tf.join_trl_lengths(rows, logs)
    assert [r["response_len_mean"] for r in joined] == [30.0, 12.5]
    with pytest.raises(ValueError, match="step 2"):
        tf.join_trl_lengths(rows, logs[1:])


def test_target_rule_and_time_to_target():
    assert tf.choose_target(0.3, [0.5, 0.4]) == pytest.approx(0.3 + 0.6 * 0.15)
    assert tf.choose_target(0.3, [0.3, 0.2]) is None and tf.choose_target(0.3, []) is None
    curve = [[0.0, 0.3, 0.02], [50.0, 0.35, 0.02], [20.0, 0.40, 0.02], [80.0, 0.5, 0.02]]
    assert tf.time_to_target(curve, 0.39) == 20.0  # time order, not list order
    assert tf.time_to_target(curve, 0.6) is None and tf.time_to_target(curve, None) is None


def test_paired_ratio_flags_a_spread_as_large_as_the_effect():
    clear = tf.paired_ratio([2.0, 2.2, 2.1], [1.0, 1.0, 1.0])
    assert clear["median"] == pytest.approx(2.1) and not clear["spread_as_large_as_effect"]
    assert clear["per_repeat"] == pytest.approx([2.0, 2.2, 2.1])
    noisy = tf.paired_ratio([1.1, 0.9, 1.05], [1.0, 1.0, 1.0])
    assert noisy["spread_as_large_as_effect"]
    with pytest.raises(ValueError):
        tf.paired_ratio([1.0], [1.0, 2.0])


def test_time_ratio_only_pairs_where_both_reached():
    r = tf.time_ratio([10.0, None, 20.0], [30.0, 40.0, None])
    assert r["pairs"] == 1 and r["median"] == 3.0
    assert tf.time_ratio([None], [5.0]) is None


def _run(sps, tps, final, curve):
    return {"samples_per_s": sps, "tokens_per_s": tps, "final_accuracy": final, "accuracy_stderr": 0.02,
            "response_len_mean": tps / sps, "curve": curve}


def test_summarize_pairs_runs_in_order_and_e2e_entry_keeps_the_checked_fields(tmp_path):
    braid = [_run(30.0, 600.0, 0.5, [[0, 0.3, 0], [10, 0.45, 0], [20, 0.5, 0]]),
             _run(40.0, 700.0, 0.5, [[0, 0.3, 0], [12, 0.5, 0]])]
    trl = [_run(10.0, 250.0, 0.4, [[0, 0.3, 0], [30, 0.42, 0]]), _run(20.0, 400.0, 0.45, [[0, 0.3, 0], [25, 0.45, 0]])]
    meta = {"matched": {"cores": 2}, "still_differs": ["x"], "provenance": {"commit": "abc"}}
    res = tf.summarize(braid, trl, (0.3, 0.02), meta)
    assert res["runs"] == 2
    assert res["samples_per_s_ratio"] == pytest.approx(2.5)  # median of 3.0 and 2.0: per pair, not of means
    assert res["tokens_per_s_ratio"] == pytest.approx((600 / 250 + 700 / 400) / 2)
    tt = res["time_to_target_s"]
    assert tt["target"] == pytest.approx(0.42)
    assert tt["braid"] == [10, 12] and tt["trl"] == [30, 25]
    assert tt["trl_over_braid"]["median"] == pytest.approx((3.0 + 25 / 12) / 2)
    with pytest.raises(ValueError):
        tf.summarize(braid, trl[:1], (0.3, 0.02), meta)

    entry = tf.e2e_entry(res)
    assert {"samples_per_s_ratio", "tokens_per_s_ratio", "runs", "spread", "time_to_target_s", "matched",
            "still_differs", "provenance", "source"} <= entry.keys()
    path = tmp_path / "e2e.json"
    path.write_text(json.dumps({"samples_per_s": {"sync": 1.0}, "trl_fair": {"old": True}}))
    set_json_key(path, "trl_fair", entry)
    doc = json.loads(path.read_text())
    assert doc["samples_per_s"] == {"sync": 1.0} and doc["trl_fair"]["runs"] == 2 and "old" not in doc["trl_fair"]


def test_interleaved_order():
    assert tf.interleaved(2) == [("braid", 0), ("trl", 0), ("trl_1t", 0), ("braid", 1), ("trl", 1), ("trl_1t", 1)]


def test_trl_is_compared_at_its_faster_thread_count():
    def runs(*sps):
        return [{"samples_per_s": x} for x in sps]

    per = {"braid": runs(10, 11), "trl": runs(5.0, 5.2), "trl_1t": runs(5.5, 5.4)}
    assert tf.best_trl(per) == "trl_1t"
    scaling = tf.thread_scaling(per)
    assert scaling["best_threads"] == 1 and scaling["threads"]["1"]["median"] == 5.45
    assert scaling["2_vs_1_threads"]["per_repeat"] == [5.0 / 5.5, 5.2 / 5.4]
    assert tf.best_trl({**per, "trl": runs(6, 6)}) == "trl"
    assert tf.seed_overrides(2) == ["generation.seed=2", "trainer.seed=2"]


def test_report_cautions_when_the_target_is_within_noise_of_the_warm_start():
    curve = [[0, 0.3, 0], [10, 0.33, 0]]
    braid = [_run(30.0, 600.0, 0.33, curve)]
    trl = [_run(10.0, 250.0, 0.32, curve)]
    meta = {"matched": {"cores": 2, "iterations": 25, "checkpoint_every": 5}, "still_differs": ["x"]}
    res = tf.summarize(braid, trl, (0.3, 0.02), meta)  # target 0.318: 0.9 standard errors above 0.3
    assert tfr.target_resolution(res) == pytest.approx(0.9)
    assert "Caution on time to target" in "\n".join(tfr._target_caveat(res))
    assert "within noise" in tfr.final_accuracy_note(res)
    far = tf.summarize([_run(30.0, 600.0, 0.6, curve)], trl, (0.3, 0.02), meta)  # target 0.48: 9 SE
    assert tfr._target_caveat(far) == [] and "more than 2 standard errors" in tfr.final_accuracy_note(far)
