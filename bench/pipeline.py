"""Pipeline benchmark: sequential vs sync vs one_step, side by side in one run.

Same warm-started model, task, seeds and iteration count for every mode; each mode runs the
real SGS (the config's engine: vLLM by default) and trainer processes on loopback. Rounds
interleave the modes (sequential, sync, one_step, then again). Reports per mode the median
[min–max] over rounds of samples/s (training samples consumed per second of RL wall time,
warm-up iteration excluded), the ratios against the naive sequential loop computed per round
(then their median and spread), and each stage's idle fraction; the JSON records provenance
(commit, config hash, engine, package versions, machine). Writes ``bench/results/pipeline.json``
and ``.md``; ``--quick`` (1 round, 6 iterations) writes to a scratch directory instead.

    python bench/pipeline.py [--config deploy/configs/default.yaml] [--iterations 12] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report_io import RecordParser, provenance, provenance_line, results_dir, spread, write_results  # noqa: E402

MODES = ("sequential", "sync", "one_step")


def run_mode(base: list[str], config: str, mode: str, work: Path, checkpoint: str, rounds: int) -> dict:
    from flows.launcher import run_processes
    from services.common.config import load_config, write_config

    run_dir = work / f"{mode}-r{rounds}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    cfg = load_config(config, [*base, f"trainer.mode={mode}"])
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
    """Median over rounds of every measured quantity, and the ratios against sequential taken
    round by round (the modes of one round ran back to back), with their spread."""
    detail = {m: {k: statistics.median(r[k] for r in rounds) for k in rounds[0]} for m, rounds in per_mode.items()}
    sps = {m: detail[m]["samples_per_s"] for m in MODES}

    def ratio(a: str, b: str) -> dict:
        return spread([x["samples_per_s"] / y["samples_per_s"] for x, y in zip(per_mode[a], per_mode[b], strict=True)])

    return {
        **meta,
        "samples_per_s": sps,
        "samples_per_s_spread": {m: spread([r["samples_per_s"] for r in per_mode[m]]) for m in MODES},
        "speedup_one_step_vs_sequential": ratio("one_step", "sequential"),
        "speedup_sync_vs_sequential": ratio("sync", "sequential"),
        "speedup_one_step_vs_sync": ratio("one_step", "sync"),
        "detail": detail,
        "all_rounds": per_mode,
        "measured_in_this_run": True,
    }


def markdown(result: dict) -> str:
    p = result["provenance"]
    lines = [
        "# Pipeline benchmark (CPU, tiny model; measured side by side in one run)",
        "",
        f"{result['iterations']} iterations x {result['samples_per_iteration']} samples per mode, "
        f"{result['repeats']} interleaved round(s), median [min–max] over rounds; engine **{result['engine']}**; "
        f"host: {p['machine']['cpu']}, {p['machine']['cores']} cores, CPU only.",
        provenance_line(p),
        "",
        "| mode | samples/s | vs sequential (per round) | idle generation | idle training | staleness |",
        "|---|---|---|---|---|---|",
    ]
    for mode in MODES:
        d, s = result["detail"][mode], result["samples_per_s_spread"][mode]
        vs = "1.00x" if mode == "sequential" else _cell(result[f"speedup_{mode}_vs_sequential"], "{:.2f}x")
        lines.append(
            f"| {mode} | {_cell(s, '{:.1f}')} | {vs} | "
            f"{d['idle_fraction_generation']:.2f} | {d['idle_fraction_training']:.2f} | {d['staleness_mean']:.2f} |"
        )
    lines += ["", f"one_step vs sync (per round): {_cell(result['speedup_one_step_vs_sync'], '{:.2f}x')}."]
    return "\n".join(lines) + "\n"


def _cell(s: dict, fmt: str) -> str:
    return f"{fmt.format(s['median'])} [{fmt.format(s['min'])}–{fmt.format(s['max'])}]"


def main() -> int:
    parser = RecordParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "deploy/configs/default.yaml"))
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds over the modes")
    parser.add_argument("--work", default=str(ROOT / "runs" / "bench-pipeline"))
    parser.add_argument("--out", default=None, help="default bench/results (--quick: /tmp/braid-bench-quick)")
    parser.add_argument("--quick", action="store_true", help="1 round of 6 iterations, into a scratch directory")
    ns = parser.parse_args()
    if ns.quick:
        ns.iterations, ns.repeats = 6, 1
    out = str(results_dir(ns.out, ns.quick))

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
        "engine": cfg.generation.engine,
        "provenance": provenance(Path(__file__), {"config": cfg.model_dump(mode="json"), "overrides": base},
                                 Path(ns.config).resolve(), cfg.generation.engine),
    }
    result = summarize(per_mode, meta)
    print(write_results(out, "pipeline", result, markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
