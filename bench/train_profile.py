"""Measured training profile vs real runs: predicted vs measured training time per iteration.

For each run directory of braid-tiny in ``sync`` or ``one_step`` mode (``config.json``,
``metrics.jsonl``, ``timeline.json``, ``router-timeline.jsonl``) and each iteration:

- **measured**: the learner's busy time in the run: ``timeline.json``'s training intervals
  (every ``backward`` call and the optimizer ``step``) without the last one, the weight publish
  (``metrics.jsonl``'s ``train_time_s`` includes it: a few ms).
- **batches**: the iteration's groups are rebuilt exactly: samples (prompt id, response tokens,
  finish time) from the router's timeline, prompt lengths by re-drawing the trainer's seeded
  ``ProblemSampler`` (eval set held out), groups in completion order, ``micro_batch_groups`` per
  ``backward`` call as the trainer's ``DynamicBatcher`` hands them over.
- **trained groups**: the learner skips groups whose advantages are all zero
  (``trained_samples`` of ``samples``); which ones is not logged, so the prediction takes the
  trained fraction of the iteration's FLOPs, bracketed by the cheapest / dearest groups.
- **padding**: the learner pads each micro-batch (``length_buckets`` of a ``backward`` call) to
  its longest sequence; the profile's grid has equal lengths. ``pad_factor`` = padded / real
  tokens of the rebuilt calls; ``predicted_padded_s`` scales the compute part by it.
- **replay** (``--replay N`` iterations of the first run): the rebuilt batches (every group
  trained, alternating rewards) timed on the learner here, alone: separates what the profile
  misses on real batches from what the run adds (threads of the trainer process on its core).

    python bench/train_profile.py [--profile P] [--replay N] RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.generation.scheduling.models import get_model  # noqa: E402
from allocator.train_profile import TrainProfile, load_train_profile  # noqa: E402
from allocator.training import TrainWorkload, step_flops  # noqa: E402
from bench.report_io import write_results  # noqa: E402

OUT = ROOT / "bench/results"
PROFILE = ROOT / "allocator/profiles/cpu-local-braid-tiny-train.json"


def prompt_lengths(cfg, iterations: int) -> dict[str, int]:
    """Prompt id -> token count of every prompt the trainer drew in ``iterations`` iterations."""
    from services.policy.model import Policy, char_tokenizer
    from services.tasks.arith import ProblemSampler, eval_problems

    dist = cfg.task.distribution()
    held_out = frozenset(p.prompt for p in eval_problems(cfg.eval.seed, cfg.eval.prompts, **dist))
    sampler = ProblemSampler(cfg.task.seed, exclude=held_out, **dist)
    enc = Policy(model=None, tokenizer=char_tokenizer())  # type: ignore[arg-type]  # the tokenizer only
    return {p.prompt_id: len(enc.encode_prompt(p.prompt))
            for p in sampler.batch(iterations * cfg.trainer.prompts_per_iteration)}


def iteration_groups(run_dir: Path) -> dict[int, list[tuple[str, list[int]]]]:
    """Iteration -> its groups (prompt id, response token counts), in group completion order."""
    events = [json.loads(line) for line in (run_dir / "router-timeline.jsonl").read_text().splitlines() if line]
    tags = {e["call"]: e["tag"] for e in events if e["event"] == "dispatch"}
    by_iter: dict[int, dict[str, list[tuple[float, int]]]] = defaultdict(lambda: defaultdict(list))
    for e in events:
        tag = tags.get(e["call"], "") if e["event"] == "sample" else ""
        if tag.startswith("iter-"):
            by_iter[int(tag[5:])][e["seq"].split("/")[0]].append((e["finished_at"], e["tokens"]))
    return {k: [(pid, [n for _, n in g]) for pid, g in sorted(groups.items(), key=lambda kv: max(t for t, _ in kv[1]))]
            for k, groups in by_iter.items()}


def pad_factor(calls: list[list[int]]) -> float:
    """Padded / real tokens of ``backward`` calls (sequence lengths each), bucketed as the learner does."""
    from services.policy.batch import length_buckets
    from services.trainer.learner import MICRO_BATCH_TOKENS

    padded = sum(len(b) * max(c[j] for j in b) for c in calls for b in length_buckets(c, MICRO_BATCH_TOKENS))
    return padded / sum(sum(c) for c in calls)


def iteration_row(prof: TrainProfile, model, cfg, row: dict, groups: list[list[int]], learner_s: float) -> dict:
    """Prediction vs measurement of one iteration (``groups``: full sequence lengths)."""
    def predict(gs: list[list[int]], scale: float = 1.0) -> float:
        seqs = [n for g in gs for n in g] or [1]
        wl = TrainWorkload(tokens=round(sum(seqs) * scale), attn_sq=sum(n * n for n in seqs) * scale,
                           mb_tokens=max(seqs), algorithm=prof.algorithm)
        return prof.seconds(step_flops(model, wl))

    mbg, frac = cfg.trainer.micro_batch_groups, row["trained_samples"] / row["samples"]
    pad = pad_factor([[n for g in groups[i:i + mbg] for n in g] for i in range(0, len(groups), mbg)])
    trained = round(frac * len(groups))
    by_cost = sorted(groups, key=lambda g: sum(n * n for n in g) + sum(g))
    est = predict(groups, frac)
    return {
        "iteration": row["iteration"], "trained_samples": row["trained_samples"], "samples": row["samples"],
        "tokens": sum(map(sum, groups)), "pad_factor": pad, "measured_learner_s": learner_s,
        "predicted_all_s": predict(groups), "predicted_s": est,
        "predicted_padded_s": prof.fixed_s + (est - prof.fixed_s) * pad,
        "predicted_low_s": predict(by_cost[:trained]), "predicted_high_s": predict(by_cost[len(groups) - trained:]),
    }


def compare_run(prof: TrainProfile, run_dir: Path) -> tuple[dict, dict[int, list[list[tuple[int, int]]]], object]:
    """The run's per-iteration rows and summary, its rebuilt groups ((prompt, response) tokens), its config."""
    from services.common.config import load_config

    cfg = load_config(run_dir / "config.json")
    if cfg.trainer.mode not in ("sync", "one_step"):
        raise ValueError(f"{run_dir}: mode {cfg.trainer.mode}: only sync and one_step runs draw prompts per iteration")
    model = get_model(prof.model.name)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    timeline = json.loads((run_dir / "timeline.json").read_text())["training"]
    plen = prompt_lengths(cfg, len(rows))
    groups = {k: [[(plen[pid], n) for n in g] for pid, g in gs] for k, gs in iteration_groups(run_dir).items()}
    its = []
    for row in rows:
        busy = [e - s for k, s, e in timeline if k == row["iteration"]]
        full = [[p + n for p, n in g] for g in groups[row["iteration"]]]
        its.append(iteration_row(prof, model, cfg, row, full, sum(busy[:-1])))
    return {"run": str(run_dir), "mode": cfg.trainer.mode, **summarise(its), "iterations": its}, groups, cfg


def replay(cfg, groups: dict[int, list[list[tuple[int, int]]]], n: int) -> list[float]:
    """Seconds of the learner here on the first ``n`` iterations' rebuilt batches (every group trained)."""
    import random

    import torch

    from allocator.train_profiler import time_step
    from services.common.types import SampleRecord
    from services.policy.model import build_policy
    from services.trainer.learner import Group, Learner

    torch.set_num_threads(cfg.trainer.threads)
    policy = build_policy(cfg.model)
    learner, rng, out, vocab = Learner(cfg, policy), random.Random(0), [], policy.model.config.vocab_size
    for k in sorted(groups)[:n]:
        batch = []
        for gi, g in enumerate(groups[k]):
            recs = [SampleRecord(f"p{gi}", f"p{gi}", i, tuple(rng.randrange(vocab) for _ in range(p)),
                                 tuple(rng.randrange(vocab) for _ in range(r)), tuple([-2.9] * r),
                                 0, "stop", 0.0, 0.0, 0.0) for i, (p, r) in enumerate(g)]
            batch.append(Group(recs, [float(i % 2) for i in range(len(recs))]))
        time_step(learner, batch, cfg.trainer.micro_batch_groups, lambda: None)
        out.append(statistics.median(time_step(learner, batch, cfg.trainer.micro_batch_groups, lambda: None)
                                     for _ in range(2)))
        print(f"  replay iteration {k}: {out[-1]:.3f} s", flush=True)
    return out


def summarise(its: list[dict]) -> dict:
    def total(key: str) -> float:
        return sum(r[key] for r in its)

    rel = [r["predicted_s"] / r["measured_learner_s"] - 1 for r in its]
    rel_pad = [r["predicted_padded_s"] / r["measured_learner_s"] - 1 for r in its]
    return {
        "n": len(its), "measured_learner_total_s": total("measured_learner_s"),
        **{f"{k}_total_s": total(f"{k}_s") for k in ("predicted", "predicted_padded", "predicted_low", "predicted_high")},
        "abs_rel_error_median": statistics.median(abs(x) for x in rel),
        "padded_abs_rel_error_median": statistics.median(abs(x) for x in rel_pad),
        "pad_factor_mean": statistics.mean(r["pad_factor"] for r in its),
    }


def markdown(result: dict) -> str:
    prof = result["profile"]
    lines = [
        "# Measured training profile vs real runs", "",
        f"Profile `{prof['path']}`: fixed {prof['fixed_s'] * 1e3:.1f} ms/step, {prof['effective_gflops']:.1f} "
        f"effective GFLOP/s, fit error median {prof['fit_median_rel_error']:.1%} / max {prof['fit_max_rel_error']:.1%}.",
        "", "Learner time summed over the run's iterations (error: predicted / measured - 1).", "",
        "| run | iterations | measured | predicted | bracket (cheapest-dearest groups) | padding x | "
        "predicted with padding | median abs. error per iteration (with padding) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["runs"]:
        m = r["measured_learner_total_s"]
        lines.append(
            f"| {r['run']} ({r['mode']}) | {r['n']} | {m:.1f} s | {r['predicted_total_s']:.1f} s "
            f"({r['predicted_total_s'] / m - 1:+.0%}) | {r['predicted_low_total_s']:.1f}-{r['predicted_high_total_s']:.1f} s | "
            f"{r['pad_factor_mean']:.2f} | {r['predicted_padded_total_s']:.1f} s ({r['predicted_padded_total_s'] / m - 1:+.0%}) | "
            f"{r['abs_rel_error_median']:.0%} ({r['padded_abs_rel_error_median']:.0%}) |")
    rep = result.get("replay")
    if rep:
        lines += ["", f"Replay of {rep['n']} iterations of {rep['run']} (every group trained) on the learner here, alone: "
                      f"{rep['replay_total_s']:.2f} s; the profile predicts {rep['predicted_all_total_s']:.2f} s "
                      f"({rep['predicted_all_total_s'] / rep['replay_total_s'] - 1:+.0%}), with padding "
                      f"{rep['predicted_all_padded_total_s']:.2f} s "
                      f"({rep['predicted_all_padded_total_s'] / rep['replay_total_s'] - 1:+.0%})."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default=str(PROFILE))
    ap.add_argument("--replay", type=int, default=0, help="replay this many iterations of the first run here")
    ap.add_argument("runs", nargs="+", help="run directories")
    ap.add_argument("--out", default=str(OUT))
    ns = ap.parse_args(argv)
    prof = load_train_profile(ns.profile)
    result: dict = {"profile": {"path": ns.profile, "fixed_s": prof.fixed_s, "effective_gflops": prof.effective_flops / 1e9,
                                "fit_median_rel_error": prof.fit_median_rel_error,
                                "fit_max_rel_error": prof.fit_max_rel_error}, "runs": []}
    first = None
    for r in ns.runs:
        summary, groups, cfg = compare_run(prof, Path(r))
        result["runs"].append(summary)
        first = first or (summary, groups, cfg)
    if ns.replay and first is not None:
        summary, groups, cfg = first
        times = replay(cfg, groups, ns.replay)
        its = summary["iterations"][:len(times)]
        result["replay"] = {
            "run": summary["run"], "n": len(times), "replay_s": times, "replay_total_s": sum(times),
            "predicted_all_total_s": sum(r["predicted_all_s"] for r in its),
            "predicted_all_padded_total_s": sum(prof.fixed_s + (r["predicted_all_s"] - prof.fixed_s) * r["pad_factor"]
                                                for r in its),
        }
    print(write_results(ns.out, "train_profile", result, markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
