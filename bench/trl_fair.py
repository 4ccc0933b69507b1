"""A fair TRL run: Braid ``sync`` against TRL's ``GRPOTrainer`` with matched settings (issue 19, item 2).

``bench/e2e.py`` compares every Braid mode with TRL, but three things confound its TRL numbers:
Braid generated with vLLM (continuous batching) and TRL with transformers; Braid's learner skipped
zero-advantage groups while TRL trained every sample; TRL ran once. This benchmark removes those:

- **same generation implementation**: Braid's SGS runs ``generation.engine: hf`` (static batches on
  transformers' stock attention, ``services/generation/hf_engine.py``) and TRL ``--generation
  generate`` (``model.generate``: static batch, stock attention). Both generate a step's
  ``prompts_per_iteration x group_size`` completions as **one** static batch (Braid's KV budget
  ``generation.num_blocks`` is raised so that all of them fit, ``static_batch_blocks``). Braid's
  default vLLM engine is *not* matched: TRL's vLLM path cannot run on this CPU machine (server mode
  transfers weights over NCCL; colocate mode reloads weights with ``model.load_weights``, which the
  vLLM CPU backend's repacked weights do not take, and TRL 1.16 supports vLLM 0.22-0.31 while the
  CPU build here is 0.32);
- **same group filtering**: neither skips zero-variance groups (``trainer.skip_zero_advantage_groups:
  false`` for Braid; TRL never skips);
- **same learning problem**: warm-start checkpoint (``ensure_warmstart``, as ``bench/e2e.py``),
  model, task, data order (``task.seed``, held-out prompts excluded), temperature 1.0 without
  top-k/top-p, ``prompts_per_iteration x group_size`` completions per optimizer step, micro batch
  (``micro_batch_groups x group_size`` completions), learning rate, weight decay, clip, KL
  coefficient, gradient clip, iterations and checkpoint cadence: one resolved config for both,
  and TRL's resolved ``GRPOConfig`` is checked against it after every run (``trl_mismatches``);
- **same cores**: 2. Braid pins its SGS to CPU 0 and its trainer to CPU 1 (one thread each, as
  ``bench/e2e.py --pin``); TRL runs one process on the same 2 cores, with 2 torch threads and, in the
  same rounds, with 1 (``trl_thread_scaling``): Braid is compared with TRL at its faster thread count;
- **repeats, interleaved**: ``--runs`` runs per system in the order Braid, TRL, TRL 1 thread, Braid, ...;
  run ``r`` of either system samples with seed ``r`` (``generation.seed``, ``trainer.seed``; same
  data order); ratios are per interleaved pair, reported as median and range.

Measured, defined identically for both systems (``steady_rates``): **samples/s** = completions
generated and trained per second of steady RL wall time, i.e. from the end of optimizer step 0 to
the end of the last step (step 0, start-up, excluded; checkpoint saving inside, as both save
inside their loops); **tokens/s** = completion tokens (the stop token included, prompt tokens not)
over the same time. Braid's tokens come from its metrics rows, TRL's from ``GRPOTrainer``'s own
``completions/mean_length`` log (``bench/trl_fair_peer.py``). **Accuracy over time**: every
``checkpoint_every`` steps both save the policy; after each run, outside the timed region,
``bench/eval_checkpoints.py`` scores every checkpoint on the same held-out prompts with the same
seeded sampling. **Time to target**: the first checkpoint time (seconds since RL began) whose
accuracy reaches ``warm + 0.6 x (Braid's mean final - warm)``, a rule fixed before comparing.

Writes ``bench/results/trl_fair.{json,md,png}`` and sets the ``trl_fair`` key of
``bench/results/e2e.json`` (``--quick``: everything under ``/tmp/braid-bench-quick``).

    python bench/trl_fair.py [--quick] [--runs 3] [--iterations N] [--reuse]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from e2e_core import choose_target as e2e_target  # noqa: E402  (pure helpers shared with bench/e2e.py)
from e2e_core import time_to_target  # noqa: E402
from trl_fair_report import markdown, plot  # noqa: E402  (the rendering)

from bench.report_io import RecordParser, flagged_ratio, results_dir, set_json_key, spread  # noqa: E402

CONFIG = ROOT / "deploy" / "configs" / "default.yaml"
CORES = 2  # both systems: Braid SGS on CPU 0 + trainer on CPU 1; TRL one process, 2 threads
TARGET_FRACTION = 0.6  # as bench/e2e.py: target = warm + 60% of the reference's gain
TRL_GENERATION = "generate"  # HF generate: the static-batch, stock-attention match of Braid's hf engine
BRAID_ENGINE = "hf"
# Full run: sized from a quick run (Braid ~4.1 s/step, TRL ~6.5 s/step here) so that 3 interleaved pairs,
# their checkpoint scoring and the set-up take <= ~25 min on this 2-core machine.
FULL = {"iterations": 25, "checkpoint_every": 5, "eval_prompts": 500, "runs": 3}
QUICK = {"iterations": 4, "checkpoint_every": 2, "eval_prompts": 64, "runs": 2}


# ---------------------------------------------------------------------------------------- pure helpers
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
        problems.append(f"cores: Braid {braid_cores} CPUs ({g['threads']}+{t['threads']} threads) vs TRL {trl['threads']} threads")
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
            s: {"per_run": [r["final_accuracy"] for r in runs], "mean": statistics.fmean(r["final_accuracy"] for r in runs),
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


# ---------------------------------------------------------------------------------------- mechanism
def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []


def run_trl_fair(run_dir: Path, checkpoint: str, threads: int, micro: int) -> None:
    from e2e import run_trl

    run_trl(run_dir, checkpoint, threads, TRL_GENERATION, peer="trl_fair_peer.py", extra=("--micro-batch", str(micro)))


def trl_optim(py: Path) -> str:
    """The optimizer TRL's GRPOConfig resolves to by default (HF TrainingArguments.optim)."""
    import subprocess

    probe = "from trl import GRPOConfig; print(GRPOConfig(output_dir='/tmp/x', use_cpu=True, report_to='none').optim)"
    out = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, cwd=ROOT, check=False)
    return out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else "?"


def measure(system: str, run_dir: Path, cfg, checkpoint: str, warm: tuple[float, float], problems, micro: int) -> dict:
    """One run (timed), then its checkpoints scored (untimed)."""
    from e2e import run_braid
    from e2e_core import curve_points
    from eval_checkpoints import evaluate_run

    t0 = time.time()
    if system in TRL_SYSTEMS:
        run_trl_fair(run_dir, checkpoint, TRL_SYSTEMS[system], micro)
    else:
        run_braid(run_dir, checkpoint)
    run_wall = time.time() - t0
    rows = read_jsonl(run_dir / "metrics.jsonl")
    summary = json.loads((run_dir / "summary.json").read_text())
    cfg_json = cfg.model_dump(mode="json")
    extra: dict = {}
    if system in TRL_SYSTEMS:
        rows = join_trl_lengths(rows, read_jsonl(run_dir / "trl_logs.jsonl"))
        bad = trl_mismatches(summary["grpo_config"], cfg_json, micro)
        if bad:
            raise RuntimeError("TRL ran unmatched settings: " + "; ".join(bad))
        extra["trl"] = {k: summary[k] for k in ("versions", "threads", "generation", "grpo_config")}
        extra["trained_fraction"] = 1.0
    else:
        generated = sum(r["samples"] for r in rows)
        extra["trained_fraction"] = sum(r["trained_samples"] for r in rows) / generated
        extra["zero_advantage_groups_skipped"] = sum(r["zero_advantage_groups"] for r in rows)
        extra["online_eval"] = {k: summary.get(k) for k in ("warmstart_accuracy", "final_accuracy", "eval_prompts")}
    t1 = time.time()
    points = [p.to_json() for p in evaluate_run(run_dir, problems, cfg.generation.max_new_tokens)]
    if not points or points[-1]["version"] != cfg.trainer.iterations:
        raise RuntimeError(f"{run_dir.name}: the final checkpoint (version {cfg.trainer.iterations}) is missing")
    return {
        "status": "ok", **steady_rates(rows), **extra,
        "final_accuracy": points[-1]["accuracy"], "accuracy_stderr": points[-1]["stderr"],
        "curve": curve_points(warm, points, summary["rl_started_at"]), "checkpoints": points,
        "rl_seconds": summary["rl_seconds"], "started_at": summary["rl_started_at"],
        "run_wall_s": run_wall, "eval_wall_s": time.time() - t1, "run_dir": str(run_dir),
    }


def main() -> int:
    parser = RecordParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(CONFIG))
    parser.add_argument("--quick", action="store_true", help=f"smoke run {QUICK}, written under /tmp/braid-bench-quick")
    parser.add_argument("--runs", type=int, default=None, help="runs per system, interleaved")
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--checkpoint-every", type=int, default=None)
    parser.add_argument("--eval-prompts", type=int, default=None)
    parser.add_argument("--reuse", action="store_true", help="reuse finished runs with identical settings")
    parser.add_argument("--work", default=str(ROOT / "runs" / "bench-trl-fair"))
    parser.add_argument("--out", default=None, help="default bench/results (--quick: /tmp/braid-bench-quick)")
    ns = parser.parse_args()

    preset = QUICK if ns.quick else FULL
    iterations = ns.iterations or preset["iterations"]
    every = ns.checkpoint_every or preset["checkpoint_every"]
    n_eval = ns.eval_prompts or preset["eval_prompts"]
    runs = ns.runs or preset["runs"]
    if iterations % every:
        parser.error(f"--checkpoint-every ({every}) must divide the iterations ({iterations})")
    if len(os.sched_getaffinity(0)) < CORES:
        parser.error(f"needs {CORES} CPUs (Braid pins its SGS and trainer to one each)")

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import torch
    import transformers
    from e2e import ensure_trl_venv, run_mode
    from e2e_core import pin_overrides
    from eval_checkpoints import DECODING, EVAL_SEED, evaluate_checkpoint

    from bench.report_io import provenance, write_results
    from services.common.config import load_config
    from services.policy.warmstart import ensure_warmstart
    from services.tasks.arith import eval_problems

    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(CORES)
    t_start = time.time()
    base_cfg = load_config(ns.config)
    checkpoint = str(ensure_warmstart(base_cfg).resolve())  # the same cached warm start as bench/e2e.py
    problems = eval_problems(base_cfg.eval.seed, n_eval, **base_cfg.task.distribution())
    warm_point = evaluate_checkpoint(checkpoint, problems, base_cfg.generation.max_new_tokens)
    warm = (warm_point.accuracy, warm_point.stderr)
    print(f"warm start {checkpoint}: accuracy {warm[0]:.3f} ± {warm[1]:.3f} on {n_eval} prompts", flush=True)
    py = ensure_trl_venv()

    tc, gc = base_cfg.trainer, base_cfg.generation
    samples = tc.prompts_per_iteration * tc.group_size
    micro = tc.micro_batch_groups * tc.group_size
    prompt_tokens = 1 + max(len(p.prompt) for p in problems) + 8  # <bos> + one token per character, margin
    blocks = max(gc.num_blocks, static_batch_blocks(samples, prompt_tokens, gc.max_new_tokens, gc.page_size))
    shared = shared_overrides(iterations, every, n_eval, blocks) + pin_overrides(True)
    trl_args = {"micro_batch": micro, "threads": CORES, "generation": TRL_GENERATION, "prompt_tokens": prompt_tokens}
    matched = matched_settings(load_config(ns.config, shared).model_dump(mode="json"), trl_args)
    matched["checkpoint"] = checkpoint
    print(f"matched: {samples} samples/step, micro batch {micro}, {iterations} steps, {runs} runs each", flush=True)

    work = Path(ns.work) / ("quick" if ns.quick else "full")
    per: dict[str, list[dict]] = {system: [] for system in SYSTEMS}
    eval_key = {"prompts": n_eval, "seed": EVAL_SEED, "decoding": DECODING, "warm": list(warm)}
    for system, r in interleaved(runs):
        run_dir = work / f"{system}-r{r}"
        cfg = load_config(ns.config, shared + seed_overrides(r))
        settings = {"config": cfg.model_dump(mode="json"), "eval": eval_key, "checkpoint": checkpoint,
                    "system": system,
                    "trl": {**trl_args, "threads": TRL_SYSTEMS[system]} if system in TRL_SYSTEMS else None}
        res = run_mode(system, run_dir, cfg, settings, ns.reuse,
                       functools.partial(measure, system, run_dir, cfg, checkpoint, warm, problems, micro))
        if res["status"] != "ok":
            print(f"{run_dir.name} failed: {res['status']}\n{res.get('traceback', '')}", file=sys.stderr)
            return 1
        print(f"{run_dir.name}: {res['samples_per_s']:.1f} samples/s, {res['tokens_per_s']:.0f} tokens/s, "
              f"final {res['final_accuracy']:.3f}", flush=True)
        per[system].append(res)

    versions = per["trl"][0]["trl"]["versions"]
    meta = {
        "matched": matched,
        "still_differs": STILL_DIFFERS,
        "order": [f"{s}-r{r}" for s, r in interleaved(runs)],
        "definitions": {
            "samples_per_s": "completions generated and trained per second of steady RL wall time: end of optimizer "
                             "step 0 to end of the last step (step 0 excluded), same for both systems",
            "tokens_per_s": "completion tokens (stop token included, prompt tokens excluded) over the same window; "
                            "Braid: metrics rows' response_len_mean; TRL: GRPOTrainer's completions/mean_length",
            "ratio": "Braid / TRL per interleaved pair; median and range over pairs",
            "spread_as_large_as_effect": "range (max - min) of the per-pair ratios >= |median - 1|",
        },
        "settings": {"quick": ns.quick, "iterations": iterations, "checkpoint_every": every, "eval_prompts": n_eval,
                     "runs": runs, "cores": CORES, "num_blocks": blocks, "decoding": DECODING, "eval_seed": EVAL_SEED},
        "trl": {"versions": versions, "optim": trl_optim(py), "generation": TRL_GENERATION, "threads": CORES},
        "host": {"summary": f"{platform.machine()}, {os.cpu_count()} cores, CPU only", "python": platform.python_version(),
                 "torch": torch.__version__, "transformers": transformers.__version__},
        "bench_wall_s": time.time() - t_start,
        "provenance": provenance(Path(__file__), {"config": base_cfg.model_dump(mode="json"), "overrides": shared,
                                                  "runs": runs, "trl": trl_args}, Path(ns.config).resolve(), BRAID_ENGINE),
    }
    meta["trl_thread_scaling"] = scaling = thread_scaling(per)
    best = best_trl(per)
    result = summarize(per["braid"], per[best], warm, meta)
    result["trl_threads_compared"] = TRL_SYSTEMS[best]
    if best != "trl":  # the matched peer's own comparison stays beside the one of record
        result[f"samples_per_s_ratio_vs_trl_{CORES}_threads"] = paired_ratio(
            [r["samples_per_s"] for r in per["braid"]], [r["samples_per_s"] for r in per["trl"]])
    print(f"TRL thread scaling: {scaling['threads']}; compared with {TRL_SYSTEMS[best]} thread(s)", flush=True)
    out = results_dir(ns.out, ns.quick)
    print(write_results(out, "trl_fair", result, markdown, plot))
    set_json_key(out / "e2e.json", "trl_fair", e2e_entry(result))
    print(f"set trl_fair in {out / 'e2e.json'}; total {time.time() - t_start:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
