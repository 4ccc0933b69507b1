"""``bench/trl_fair.py``'s pure part: the settings both systems share and how they are checked, the
interleaved order and TRL's thread scaling, one definition of the steady rates for both systems,
the target and time to target, paired ratios, the summary and what ``e2e.json`` keeps. No process,
no file: ``tests/unit/test_trl_fair.py`` exercises all of it."""

from __future__ import annotations

import math
import statistics

from e2e_core import choose_target as e2e_target  # pure helpers shared with bench/e2e.py
from e2e_core import time_to_target

from bench.report_io import flagged_ratio, spread

CORES = 2  # both systems: Braid SGS on CPU 0 + trainer on CPU 1; TRL one process, 2 threads
TARGET_FRACTION = 0.6  # as bench/e2e.py: target = warm + 60% of the reference's gain
TRL_GENERATION = "generate"  # HF generate: the static-batch, stock-attention match of Braid's hf engine
BRAID_ENGINE = "hf"


def static_batch_blocks(samples: int, prompt_tokens: int, max_new_tokens: int, page_size: int) -> int:
    """KV blocks for Braid's hf engine to admit ``samples`` requests of ``prompt_tokens`` +
    ``max_new_tokens`` as one static batch (its admission budget is ``num_blocks x page_size`` tokens)."""
    return math.ceil(samples * (prompt_tokens + max_new_tokens) / page_size)


def shared_overrides(iterations: int, every: int, n_eval: int, blocks: int) -> list[str]:
    """The config both systems read (one resolved config.json per run: TRL ignores Braid-only fields)."""
    return [
        f"trainer.iterations={iterations}", f"trainer.checkpoint_every={every}", f"eval.prompts={n_eval}",
        "trainer.mode=sync", "generation.instances=1", f"generation.engine={BRAID_ENGINE}",
        f"generation.num_blocks={blocks}", "trainer.skip_zero_advantage_groups=false",
        "generation.threads=1", "trainer.threads=1",
    ]


def seed_overrides(r: int) -> list[str]:
    """Run ``r`` of either system: sampling seed ``r`` (same data order, ``task.seed`` unchanged)."""
    return [f"generation.seed={r}", f"trainer.seed={r}"]


# TRL's thread scaling (issue 34): TRL runs with CORES torch threads (the matched peer) and with 1, in the
# same interleaved rounds, each process on the same CORES cores; the comparison of record takes TRL at
# whichever thread count gave it the higher median samples/s (the peer at its best settings)
TRL_SYSTEMS = {"trl": CORES, "trl_1t": 1}  # system -> torch threads
SYSTEMS = ("braid", *TRL_SYSTEMS)


def interleaved(runs: int) -> list[tuple[str, int]]:
    """The order of record: (braid, 0), (trl, 0), (trl_1t, 0), (braid, 1), ..."""
    return [(system, r) for r in range(runs) for system in SYSTEMS]


def best_trl(per: dict[str, list[dict]]) -> str:
    """The TRL system (thread count) with the higher median samples/s."""
    return max(TRL_SYSTEMS, key=lambda s: statistics.median(r["samples_per_s"] for r in per[s]))


def thread_scaling(per: dict[str, list[dict]]) -> dict:
    """TRL's samples/s at each thread count, and CORES threads over 1 per interleaved round."""
    return {"threads": {str(t): spread([r["samples_per_s"] for r in per[s]]) for s, t in TRL_SYSTEMS.items()},
            f"{CORES}_vs_1_threads": paired_ratio([r["samples_per_s"] for r in per["trl"]],
                                                  [r["samples_per_s"] for r in per["trl_1t"]]),
            "best_threads": TRL_SYSTEMS[best_trl(per)]}


def matched_settings(cfg: dict, trl: dict) -> dict:
    """The settings both systems share, from the one resolved config (``cfg``: ``RunConfig`` as JSON)
    and the TRL peer's arguments (``trl``: micro_batch, threads, generation); raises ``ValueError``
    naming every setting that would make the pair unmatched."""
    t, g = cfg["trainer"], cfg["generation"]
    problems = []
    samples = t["prompts_per_iteration"] * t["group_size"]
    micro = t["micro_batch_groups"] * t["group_size"]
    if t["mode"] != "sync":
        problems.append(f"trainer.mode is {t['mode']!r}: TRL is synchronous on-policy, the match is Braid sync")
    if (g["engine"], trl["generation"]) != (BRAID_ENGINE, TRL_GENERATION):
        problems.append(f"generation {g['engine']!r} vs TRL {trl['generation']!r}: the matched pair is hf vs generate")
    if t["skip_zero_advantage_groups"]:
        problems.append("Braid skips zero-advantage groups; TRL trains them")
    if trl["micro_batch"] != micro:
        problems.append(f"micro batch: Braid {micro} completions vs TRL {trl['micro_batch']}")
    if samples % trl["micro_batch"]:
        problems.append(f"TRL's micro batch {trl['micro_batch']} does not divide the {samples} samples per step")
    braid_cores = len(set(g["cpus"]) | set(t["cpus"]))
    if braid_cores != trl["threads"] or g["threads"] + t["threads"] != trl["threads"]:
        problems.append(f"cores: Braid {braid_cores} CPUs ({g['threads']}+{t['threads']} threads) vs TRL "
                        f"{trl['threads']} threads")
    if g["instances"] != 1:
        problems.append("Braid runs one SGS instance (one static batch per step, like TRL's one generate call)")
    needed = static_batch_blocks(samples, trl.get("prompt_tokens", 0), g["max_new_tokens"], g["page_size"])
    if g["num_blocks"] < needed or g["max_inflight"] < samples:
        problems.append(f"Braid's static batch holds fewer than the {samples} completions of a step")
    if problems:
        raise ValueError("unmatched: " + "; ".join(problems))
    return {
        "model": cfg["model"], "task": cfg["task"], "task_seed": cfg["task"].get("seed"),
        "held_out": {"prompts": cfg["eval"]["prompts"], "seed": cfg["eval"]["seed"]},
        "temperature": g["temperature"], "top_k": None, "top_p": None, "max_new_tokens": g["max_new_tokens"],
        "prompts_per_step": t["prompts_per_iteration"], "group_size": t["group_size"], "samples_per_step": samples,
        "micro_batch_completions": micro, "lr": t["lr"], "lr_schedule": "constant", "weight_decay": t["weight_decay"],
        "clip_eps": t["clip_eps"], "kl_coef": t["kl_coef"], "max_grad_norm": t["max_grad_norm"],
        "loss": f"{t['algorithm']['loss_agg']} (TRL loss_type=grpo)", "advantage": t["algorithm"]["advantage"],
        "iterations": t["iterations"], "checkpoint_every": t["checkpoint_every"],
        "zero_advantage_groups": "trained by both (Braid trainer.skip_zero_advantage_groups=false)",
        "generation": f"Braid engine {g['engine']} (static batch of {samples}, HF stock attention) vs "
                      f"TRL {trl['generation']} (HF generate, static batch, stock attention)",
        "cores": trl["threads"], "braid_pinning": {"sgs_cpus": g["cpus"], "trainer_cpus": t["cpus"],
                                                   "sgs_threads": g["threads"], "trainer_threads": t["threads"]},
        "trl_threads": trl["threads"], "sgs_instances": g["instances"], "dtype": t["dtype"],
    }


def trl_mismatches(grpo: dict, cfg: dict, micro: int) -> list[str]:
    """What TRL actually ran (its resolved ``GRPOConfig`` fields, from the peer's summary) against the
    config: every field that differs, as text (empty when the run was matched)."""
    t, g = cfg["trainer"], cfg["generation"]
    samples = t["prompts_per_iteration"] * t["group_size"]
    want = {
        "num_generations": t["group_size"], "max_completion_length": g["max_new_tokens"],
        "temperature": g["temperature"], "learning_rate": t["lr"], "lr_scheduler_type": "constant",
        "beta": t["kl_coef"], "epsilon": t["clip_eps"], "loss_type": "grpo", "scale_rewards": "group",
        "max_grad_norm": t["max_grad_norm"], "per_device_train_batch_size": micro,
        "generation_batch_size": samples,
    }
    out = []
    for key, value in want.items():
        got = grpo.get(key)
        got = str(got).split(".")[-1].lower() if key == "lr_scheduler_type" else got
        if got != value:
            out.append(f"{key}: TRL {got!r} vs config {value!r}")
    if grpo.get("per_device_train_batch_size", 0) * grpo.get("gradient_accumulation_steps", 0) != samples:
        out.append(f"TRL's optimizer step does not take the {samples} completions of one step")
    if t["algorithm"]["loss_agg"] != "sample_mean":
        out.append(f"Braid's loss_agg {t['algorithm']['loss_agg']!r} is not TRL grpo's per-sample token mean")
    return out


def steady_rates(rows: list[dict]) -> dict:
    """Completions and completion tokens per second of steady RL wall time: from the end of step 0
    to the end of the last step (the same definition for Braid's and TRL's rows: ``t_end``,
    ``samples``, ``response_len_mean``)."""
    if len(rows) < 2:
        raise ValueError(f"{len(rows)} steps recorded: the steady window needs at least 2")
    rows = sorted(rows, key=lambda r: r["iteration"])
    steady = rows[1:]
    wall = rows[-1]["t_end"] - rows[0]["t_end"]
    if wall <= 0:
        raise ValueError("steady window of zero length")
    samples = sum(r["samples"] for r in steady)
    tokens = sum(r["samples"] * r["response_len_mean"] for r in steady)
    return {"samples": samples, "tokens": tokens, "wall_s": wall, "samples_per_s": samples / wall,
            "tokens_per_s": tokens / wall, "steps_counted": len(steady),
            "response_len_mean": tokens / samples}


def join_trl_lengths(rows: list[dict], logs: list[dict]) -> list[dict]:
    """TRL's metrics rows (``iteration`` = step - 1) with ``response_len_mean`` from its logged
    ``completions/mean_length`` of the same step; raises when a step has no log."""
    by_step = {int(x["step"]): x for x in logs}
    out = []
    for r in rows:
        log = by_step.get(int(r["iteration"]) + 1)
        if log is None or log.get("completions/mean_length") is None:
            raise ValueError(f"no completion length logged for TRL step {r['iteration'] + 1}")
        out.append({**r, "response_len_mean": float(log["completions/mean_length"])})
    return out


def choose_target(warm: float, braid_finals: list[float], fraction: float = TARGET_FRACTION) -> float | None:
    """``warm + fraction x (mean of Braid's finals - warm)``; None when Braid did not improve."""
    return e2e_target(warm, statistics.fmean(braid_finals) if braid_finals else None, fraction)


def paired_ratio(num: list[float], den: list[float]) -> dict:
    """Per interleaved pair num[i] / den[i], median and range, flagged when the range is at least
    the effect |median - 1| (the comparison is then not resolved)."""
    return flagged_ratio(num, den)


def time_ratio(braid: list[float | None], trl: list[float | None]) -> dict | None:
    """TRL's time to target over Braid's, per pair where both reached it (>1: Braid got there sooner)."""
    pairs = [(b, t) for b, t in zip(braid, trl, strict=True) if b is not None and t is not None and b > 0]
    if not pairs:
        return None
    return paired_ratio([t for _, t in pairs], [b for b, _ in pairs]) | {"pairs": len(pairs)}


def summarize(braid: list[dict], trl: list[dict], warm: tuple[float, float], meta: dict) -> dict:
    """The result document from the per-run results of both systems (same length, pair order)."""
    if len(braid) != len(trl) or not braid:
        raise ValueError(f"{len(braid)} Braid runs vs {len(trl)} TRL runs")
    out: dict = {}
    for key in ("samples_per_s", "tokens_per_s"):
        b, t = [r[key] for r in braid], [r[key] for r in trl]
        out[f"{key}_ratio"] = paired_ratio(b, t)["median"]
    target = choose_target(warm[0], [r["final_accuracy"] for r in braid])
    ttt = {s: [time_to_target(r["curve"], target) for r in runs] for s, runs in (("braid", braid), ("trl", trl))}

    def med(xs: list[float | None]) -> float | None:
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else None

    out.update({
        "runs": len(braid),
        "spread": {
            "samples_per_s_ratio": paired_ratio([r["samples_per_s"] for r in braid], [r["samples_per_s"] for r in trl]),
            "tokens_per_s_ratio": paired_ratio([r["tokens_per_s"] for r in braid], [r["tokens_per_s"] for r in trl]),
            "samples_per_s": {"braid": spread([r["samples_per_s"] for r in braid]),
                              "trl": spread([r["samples_per_s"] for r in trl])},
            "tokens_per_s": {"braid": spread([r["tokens_per_s"] for r in braid]),
                             "trl": spread([r["tokens_per_s"] for r in trl])},
            "response_len_mean": {"braid": spread([r["response_len_mean"] for r in braid]),
                                  "trl": spread([r["response_len_mean"] for r in trl])},
        },
        "time_to_target_s": {
            "target": target,
            "rule": f"warm start + {TARGET_FRACTION:g} x (mean of Braid's final accuracies - warm start), "
                    "set before comparing; first checkpoint at or above it",
            "braid": ttt["braid"], "trl": ttt["trl"],
            "braid_median": med(ttt["braid"]), "trl_median": med(ttt["trl"]),
            "reached": {s: sum(x is not None for x in v) for s, v in ttt.items()},
            "trl_over_braid": time_ratio(ttt["braid"], ttt["trl"]),
        },
        "final_accuracy": {
            s: {"per_run": [r["final_accuracy"] for r in runs],
                "mean": statistics.fmean(r["final_accuracy"] for r in runs),
                "stderr_per_run": [r["accuracy_stderr"] for r in runs]}
            for s, runs in (("braid", braid), ("trl", trl))
        },
        "warmstart_accuracy": {"accuracy": warm[0], "stderr": warm[1]},
        **meta,
        "per_run": {"braid": braid, "trl": trl},
    })
    return out


def e2e_entry(result: dict) -> dict:
    """What ``bench/results/e2e.json`` keeps under ``trl_fair``."""
    return {
        "samples_per_s_ratio": result["samples_per_s_ratio"],
        "tokens_per_s_ratio": result["tokens_per_s_ratio"],
        "runs": result["runs"],
        "spread": {k: result["spread"][k] for k in ("samples_per_s_ratio", "tokens_per_s_ratio", "samples_per_s",
                                                     "tokens_per_s")},
        "time_to_target_s": result["time_to_target_s"],
        "final_accuracy": {s: result["final_accuracy"][s]["mean"] for s in ("braid", "trl")},
        "trl_threads_compared": result.get("trl_threads_compared"),
        "trl_thread_scaling": result.get("trl_thread_scaling"),
        "matched": result["matched"],
        "still_differs": result["still_differs"],
        "provenance": result["provenance"],
        "source": "bench/trl_fair.py",
    }


STILL_DIFFERS = [
    "Process structure: Braid is two processes (SGS pinned to CPU 0, trainer pinned to CPU 1, one thread "
    "each) talking gRPC, and pushes the new weights to the SGS after every step (snapshot, relay, reload); "
    "TRL is one process whose generate and train phases each use both cores (2 torch threads), with no "
    "weight transfer. Same 2 cores in total, divided differently.",
    "Streaming: Braid sync trains each micro-batch of complete groups while the rest of the batch is still "
    "generating (the tail overlaps training); TRL trains only after the whole batch is generated. This is "
    "Braid's design, part of what is measured, not a confound to remove.",
    "Generation code: both run transformers' stock attention on one static batch, but Braid's hf engine is "
    "its own decode loop (left-padded prefill, DynamicCache, one multinomial per step) while TRL calls "
    "model.generate (its logits processors, stopping criteria); random streams differ, so completions and "
    "their lengths differ (tokens/s is reported beside samples/s for that reason).",
    "Behaviour log-probs: Braid's ratio uses the SGS's sampled-token log-probs (computed in another "
    "process, another batch shape); TRL (num_iterations=1) uses the detached training forward, so its "
    "ratio is exactly 1. Same gradient in exact arithmetic; in floats Braid's clip may bind on rare tokens.",
    "Advantage scale: Braid divides by the population std + 1e-6, TRL by the Bessel-corrected std + 1e-4 "
    "(x0.935 for groups of 8). AdamW is nearly invariant to a global gradient scale; gradient clipping is not.",
    "Micro-batches: Braid releases 8 complete groups at a time and length-buckets them (<= 4096 padded "
    "tokens per forward/backward); TRL pads the generation batch to its longest completion and splits it "
    "into 4 micro-batches of 64.",
    "Optimizer: torch AdamW in both (lr, betas 0.9/0.999, eps 1e-8, no weight decay, constant lr), Braid's "
    "own, TRL's through the HF Trainer/accelerate (its gradient clipping and optimizer variant: see "
    "trl.optim in the results).",
    "Evaluation around RL: Braid's trainer scores the held-out prompts through the SGS before and after RL "
    "(outside the steady window, inside the run's wall time); TRL does not. Both save checkpoints inside "
    "the timed loop.",
    "Not matched at all: Braid's default vLLM engine (continuous batching). TRL's vLLM path does not run "
    "on this CPU machine (server mode moves weights over NCCL; colocate mode reloads them with "
    "model.load_weights, which the vLLM CPU backend's repacked weights do not take; TRL 1.16 supports "
    "vLLM 0.22-0.31, the CPU build here is 0.32), so e2e's vLLM-vs-TRL ratio stays unmatched.",
]
