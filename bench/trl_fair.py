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
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from trl_fair_core import (  # noqa: E402  (the pure part)
    BRAID_ENGINE,
    CORES,
    STILL_DIFFERS,
    SYSTEMS,
    TRL_GENERATION,
    TRL_SYSTEMS,
    best_trl,
    e2e_entry,
    interleaved,
    join_trl_lengths,
    matched_settings,
    paired_ratio,
    seed_overrides,
    shared_overrides,
    static_batch_blocks,
    steady_rates,
    summarize,
    thread_scaling,
    trl_mismatches,
)
from trl_fair_report import markdown, plot  # noqa: E402  (the rendering)

from bench.report_io import RecordParser, results_dir, set_json_key  # noqa: E402

CONFIG = ROOT / "deploy" / "configs" / "default.yaml"
# Full run: sized from a quick run (Braid ~4.1 s/step, TRL ~6.5 s/step here) so that 3 interleaved pairs,
# their checkpoint scoring and the set-up take <= ~25 min on this 2-core machine.
FULL = {"iterations": 25, "checkpoint_every": 5, "eval_prompts": 500, "runs": 3}
QUICK = {"iterations": 4, "checkpoint_every": 2, "eval_prompts": 64, "runs": 2}


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


DEFINITIONS = {  # the result's metrics, written into it
    "samples_per_s": "completions generated and trained per second of steady RL wall time: end of optimizer "
                     "step 0 to end of the last step (step 0 excluded), same for both systems",
    "tokens_per_s": "completion tokens (stop token included, prompt tokens excluded) over the same window; "
                    "Braid: metrics rows' response_len_mean; TRL: GRPOTrainer's completions/mean_length",
    "ratio": "Braid / TRL per interleaved pair; median and range over pairs",
    "spread_as_large_as_effect": "range (max - min) of the per-pair ratios >= |median - 1|",
}


def build_parser() -> argparse.ArgumentParser:
    """The command line: presets, runs per system, the cache of finished runs."""
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
    return parser


def main() -> int:
    parser = build_parser()
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
        "definitions": DEFINITIONS,
        "settings": {"quick": ns.quick, "iterations": iterations, "checkpoint_every": every, "eval_prompts": n_eval,
                     "runs": runs, "cores": CORES, "num_blocks": blocks, "decoding": DECODING, "eval_seed": EVAL_SEED},
        "trl": {"versions": versions, "optim": trl_optim(py), "generation": TRL_GENERATION, "threads": CORES},
        "host": {"summary": f"{platform.machine()}, {os.cpu_count()} cores, CPU only",
                 "python": platform.python_version(), "torch": torch.__version__,
                 "transformers": transformers.__version__},
        "bench_wall_s": time.time() - t_start,
        "provenance": provenance(Path(__file__), {"config": base_cfg.model_dump(mode="json"), "overrides": shared,
                                                  "runs": runs, "trl": trl_args}, Path(ns.config).resolve(),
                                 BRAID_ENGINE),
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
