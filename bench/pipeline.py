"""Pipeline benchmark: sequential vs sync vs one_step, side by side in one run.

Same warm-started model, task, seeds and iteration count for every mode; each mode runs the
real SGS and trainer processes on loopback. Reports samples/s (training samples consumed per
second of RL wall time, warm-up iteration excluded), the ratios against the naive sequential
loop, and each stage's idle fraction. Writes ``bench/results/pipeline.json`` and
``bench/results/pipeline.md``.

    python bench/pipeline.py [--config deploy/configs/default.yaml] [--iterations 12]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report_io import write_results  # noqa: E402

MODES = ("sequential", "sync", "one_step")


def run_mode(base: list[str], config: str, mode: str, work: Path, checkpoint: str, rounds: int) -> dict:
    from flows.launcher import run_processes
    from services.common.config import load_config, write_config

    run_dir = work / f"{mode}-r{rounds}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    cfg = load_config(config, base + [f"trainer.mode={mode}"])
    write_config(cfg, run_dir / "config.json")
    run_processes(run_dir, checkpoint)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steady = rows[1:] or rows  # iteration 0 includes start-up effects
    wall = sum(r["iteration_time_s"] for r in steady)
    return {
        "samples": sum(r["samples"] for r in steady),
        "wall_s": wall,
        "samples_per_s": sum(r["samples"] for r in steady) / wall,
        "tokens_per_s": sum(r["tokens_per_s"] * r["iteration_time_s"] for r in steady) / wall,
        "idle_fraction_generation": sum(r["idle_gen_s"] for r in steady) / wall,
        "idle_fraction_training": sum(r["idle_train_s"] for r in steady) / wall,
        "staleness_mean": sum(r["staleness_mean"] for r in steady) / len(steady),
        "reward_mean": sum(r["reward_mean"] for r in steady) / len(steady),
    }


def summarize(per_mode: dict[str, list[dict]], meta: dict) -> dict:
    """Mean over rounds of every measured quantity, plus the ratios against sequential."""
    detail = {m: {k: statistics.fmean(r[k] for r in rounds) for k in rounds[0]} for m, rounds in per_mode.items()}
    sps = {m: detail[m]["samples_per_s"] for m in MODES}
    return {
        **meta,
        "samples_per_s": sps,
        "speedup_one_step_vs_sequential": sps["one_step"] / sps["sequential"],
        "speedup_sync_vs_sequential": sps["sync"] / sps["sequential"],
        "detail": detail,
        "all_rounds": per_mode,
    }


def markdown(result: dict) -> str:
    lines = [
        "# Pipeline benchmark (CPU, tiny model; measured side by side in one run)",
        "",
        f"{result['iterations']} iterations x {result['samples_per_iteration']} samples per mode, "
        f"{result['repeats']} alternating round(s), mean reported; host: {result['host']}.",
        "",
        "| mode | samples/s | vs sequential | idle generation | idle training | staleness |",
        "|---|---|---|---|---|---|",
    ]
    seq = result["samples_per_s"]["sequential"]
    for mode in MODES:
        d = result["detail"][mode]
        lines.append(
            f"| {mode} | {result['samples_per_s'][mode]:.1f} | {result['samples_per_s'][mode] / seq:.2f}x | "
            f"{d['idle_fraction_generation']:.2f} | {d['idle_fraction_training']:.2f} | {d['staleness_mean']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "deploy/configs/default.yaml"))
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=1, help="alternating rounds over the modes")
    parser.add_argument("--work", default=str(ROOT / "runs" / "bench-pipeline"))
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ns = parser.parse_args()

    from services.common.config import load_config
    from services.policy.warmstart import ensure_warmstart

    base = [f"trainer.iterations={ns.iterations}", "eval.prompts=16"]
    checkpoint = str(ensure_warmstart(load_config(ns.config)).resolve())
    work = Path(ns.work)
    per_mode: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(ns.repeats):
        for mode in MODES:
            t0 = time.time()
            per_mode[mode].append(run_mode(base, ns.config, mode, work, checkpoint, r))
            print(f"[round {r}] {mode}: {per_mode[mode][-1]['samples_per_s']:.1f} samples/s ({time.time() - t0:.0f}s)")
    cfg = load_config(ns.config)
    meta = {
        "iterations": ns.iterations,
        "samples_per_iteration": cfg.trainer.prompts_per_iteration * cfg.trainer.group_size,
        "repeats": ns.repeats,
        "host": f"{platform.machine()}, {os.cpu_count()} cores, CPU only",
    }
    result = summarize(per_mode, meta)
    print(write_results(ns.out, "pipeline", result, markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
