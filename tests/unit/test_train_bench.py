"""Pure parts of the trainer benchmark (bench/train.py): its batches and its summary; no rank starts."""

from __future__ import annotations

from bench import train as tb


def test_batches_are_the_tasks_prompts_with_trainable_groups():
    from services.common.config import load_config
    from services.policy.model import build_policy

    cfg = load_config(tb.CONFIG)
    policy = build_policy(cfg.model)
    groups = tb.batch(cfg, policy, seed=0)
    assert len(groups) == cfg.trainer.prompts_per_iteration
    assert all(len(g.samples) == cfg.trainer.group_size and len(set(g.rewards)) == 2 for g in groups)  # all train
    assert all(len(s.logprobs) == len(s.token_ids) <= tb.RESPONSE_CAP for g in groups for s in g.samples)
    again = tb.batch(cfg, policy, seed=0)
    assert [s.token_ids for g in again for s in g.samples] == [s.token_ids for g in groups for s in g.samples]


def _rec(tps: float, peaks: list[float]) -> dict:
    return {"tokens_per_s": tps, "model_bytes": 4096, "push_peak_fraction": peaks}


def test_ratios_are_taken_per_round_and_push_peaks_per_rank():
    runs = {"default": {1: [_rec(100, [1.1]), _rec(50, [1.0]), _rec(80, [1.2])],
                        2: [_rec(150, [1.0, 0.1]), _rec(100, [1.1, 0.3]), _rec(80, [1.05, 0.2])]}}
    s = tb.summarise(runs)["default"]
    assert s["dp2_vs_dp1"]["per_repeat"] == [1.5, 2.0, 1.0] and s["dp2_vs_dp1"]["median"] == 1.5
    assert s["push_peak_fraction"]["rank1"] == {"median": 0.2, "min": 0.1, "max": 0.3, "n": 3}
    assert s["push_peak_fraction"]["rank0"]["median"] == 1.05
    md = tb.markdown({"provenance": {"commit": "abcdef123456789", "dirty": False, "config_hash": "c", "date": "d",
                                     "machine": {"cpu": "x", "cores": 2, "mem_gb": 4.0}, "versions": {}},
                      "samples_per_step": 256, "steps": 4, "repeats": 3, "sizes": tb.summarise(runs)})
    assert "**1.50 [1.00–2.00]x**" in md
