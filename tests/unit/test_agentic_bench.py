"""bench/agentic.py's pure parts: the variants and their settings, the per-run measure, the ratios."""

from __future__ import annotations

import sys
from argparse import Namespace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.agentic import markdown, overrides, run_metrics, summarize, variants  # noqa: E402
from services.common.config import load_config  # noqa: E402

NS = Namespace(eta=1, group_size=8, groups=8, redundant_groups=2, iterations=10, eval_prompts=8,
               workers=4, mu=0.5, min_steps=3)


def test_the_variants_differ_only_in_what_is_compared():
    plan = variants(("0.1", "1.0"), redundant=2)
    assert list(plan) == ["traj@0.1", "batch@0.1", "traj@1.0", "batch@1.0", "redundant@1.0"]
    cfgs = {name: load_config(ROOT / "deploy/configs/agentic.yaml", overrides(v, NS, 1)) for name, v in plan.items()}
    t, b = cfgs["traj@1.0"], cfgs["batch@1.0"]
    assert (t.agentic.interaction, b.agentic.interaction) == ("trajectory", "batch")
    assert t.model_copy(update={"agentic": b.agentic}) == b  # nothing else differs
    assert t.agentic.latency.std_s == 0.5 and cfgs["traj@0.1"].agentic.latency.std_s == 0.05
    r = cfgs["redundant@1.0"]
    assert ((r.trainer.redundancy_groups, r.agentic.redundant_trajectories) == (2, 2)
            and t.trainer.redundancy_groups == 0)
    assert r.agentic.concurrency == 2 * 10 * 10 and t.agentic.concurrency == 2 * 8 * 8  # the extra on top
    assert (t.trainer.mode, t.trainer.eta) == ("bounded", 1) and t.trainer.seed == 1 and t.agentic.latency.seed == 1


def _rows(times):
    return [{"iteration_time_s": x, "trajectories": 64, "turns_mean": 4.0, "env_latency_s_mean": 0.5,
             "bound_violations": 0, "trajectories_launched": 900, "trajectories_aborted": 100, "aborted_tokens": 500}
            for x in times]


def test_time_per_step_counts_whole_waves_after_the_warmup():
    m = run_metrics(_rows([9.0, 9.0, 8.0, 0.5, 7.5, 1.0]), warmup=2)
    assert m["step_time_s"] == 17.0 / 4  # (8 + 0.5 + 7.5 + 1) / 4: not the median of alternating steps
    assert m["trajectories_per_s"] == 4 * 64 / 17.0 and m["aborted"] == 100


def test_ratios_are_batch_over_trajectory_per_round_and_the_goal_can_fail():
    def run(step):
        return {"step_time_s": step, "trajectories_per_s": 64 / step, "launched": 100, "aborted": 20,
                "aborted_tokens": 300, "violations": 0}

    runs = {"traj@0.1": [run(4.0)] * 3, "batch@0.1": [run(4.4)] * 3, "traj@1.0": [run(4.0)] * 3,
            "batch@1.0": [run(8.0), run(7.6), run(8.4)], "redundant@1.0": [run(3.2)] * 3}
    res = summarize(runs, ("0.1", "1.0"), 2, 2)
    assert res["traj_vs_batch"] == {"0.1": 1.1, "1.0": 2.0} and res["gain_grows_with_variance"] and res["goal_met"]
    assert res["redundant_vs_none"] == 1.25 and res["redundant_detail"]["aborted_fraction"] == 0.2
    runs["batch@1.0"] = [run(5.0)] * 3  # 1.25x at sigma/mu = 1: below the goal
    assert not summarize(runs, ("0.1", "1.0"), 2, 2)["goal_met"]
    runs["batch@0.1"] = [run(6.0)] * 3  # the gain shrinks with the variance
    assert not summarize(runs, ("0.1", "1.0"), 2, 2)["gain_grows_with_variance"]
    res = summarize(runs, ("0.1", "1.0"), 2, 2) | {"settings": {"env": "calculator", "engine": "vllm", "groups": 8,
                                                                 "group_size": 8, "mu": 0.5, "workers": 4, "rounds": 3,
                                                                 "iterations": 10, "warmup": 2}}
    res["provenance"] = {"commit": "0" * 40, "dirty": False, "config_hash": "x", "date": "d", "versions": {},
                         "machine": {"cpu": "c", "cores": 2, "mem_gb": 24.0}}
    assert "**missed**" in markdown(res)
