"""Dynamic scale-out benchmark (StreamRL §4.2 "Dynamic adjustment", Figure 11), real processes.

Two real runs on this machine, side by side, with the same warm-started tiny model, prompts and
seeds: the trainer asks for forced output lengths that grow linearly over the iterations
(``forced_length_ramp``: iteration k generates exactly ``start + k * per_iteration`` tokens),
so generation time grows faster than training time and delta = T_gen - T_train climbs, as in
Figure 11. One run has the scale-out controller on (``scaleout.enabled``, flows/scaleout.py):
when delta reaches delta' = T_gen / (n + 1) it starts one more SGS instance process and the
router takes it in. The baseline runs the same ramp with the controller off. Both runs use the
router (``generation.dispatch.router: on``), one_step pipelining, the first SGS instance pinned
to CPU 0 and the trainer to CPU 1; an added instance is pinned to CPU 1 (the trainer's core,
idle while the trainer waits for generation). The KL term (``trainer.kl_coef``) is on so every
sample costs training compute (forced-length samples all score 0 and GRPO would skip them).

Writes ``bench/results/scaleout.json`` (``scaleout_events``, ``delta_before_s``,
``delta_after_s``, per-iteration delta/T_gen/T_train of both runs, definitions), a markdown
table ``scaleout.md`` and ``scaleout.png`` (delta per iteration, events marked).

    python bench/scaleout.py [--quick]

Taken on a shared 2-core machine: absolute times are noisy; compare the two runs' columns.
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

from bench.report_io import RecordParser, provenance, provenance_line, results_dir, write_results  # noqa: E402

BASE = [
    "trainer.mode=one_step", "trainer.prompts_per_iteration=8", "trainer.group_size=8", "trainer.micro_batch_groups=8",
    "trainer.kl_coef=0.001", "warmstart.steps=20", "warmstart.target_accuracy=null", "eval.prompts=8",
    "generation.max_new_tokens=256",
    "generation.forced_lengths=true", "generation.max_inflight=64", "generation.num_blocks=32",
    "generation.dispatch.router='on'", "generation.dispatch.policy=least_loaded",
    "generation.cpus=[0]", "trainer.cpus=[1]", "scaleout.cpus=[1]", "scaleout.max_instances=2",
    "scaleout.window=2", "scaleout.cooldown=2", "scaleout.scale_in=false",
]
# Declared before the run of record (issue 30): each instance's KV cache holds 32 x 32 = 1,024 tokens, so
# generation is memory-bound like an H20 site's (fewer sequences fit as outputs grow) and falls behind
# the trainer. The regime before it (512 blocks = 16K tokens) never fell behind with vLLM: no event.
REGIME = "kv-bound: generation.num_blocks=32 (1,024 KV tokens per instance)"
PREVIOUS_KEYS = ("regime", "scaleout_events", "delta_before_s", "delta_after_s", "rl_wall_speedup",
                 "speedup_after_join")
QUICK = ["trainer.iterations=14", "forced_length_ramp.start=16", "forced_length_ramp.per_iteration=10"]
FULL = ["trainer.iterations=20", "forced_length_ramp.start=16", "forced_length_ramp.per_iteration=7"]


def run(name: str, overrides: list[str], config: str, work: Path, checkpoint: str) -> Path:
    from flows.launcher import run_processes
    from services.common.config import load_config, write_config

    run_dir = work / name
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    write_config(load_config(config, overrides), run_dir / "config.json")
    t0 = time.time()
    run_processes(run_dir, checkpoint)
    print(f"{name}: {time.time() - t0:.0f}s", flush=True)
    return run_dir


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def per_iteration(run_dir: Path) -> list[dict]:
    decisions = {e["iteration"]: e for e in _jsonl(run_dir / "scaleout.jsonl") if e["event"] == "decision"}
    from allocator.scaleout import generation_time

    rows = []
    prev: float | None = None
    for r in _jsonl(run_dir / "metrics.jsonl"):
        d = decisions.get(r["iteration"], {})
        t_gen = (generation_time(r["gen_first_start"], r["gen_last_finish"], prev) if "gen_first_start" in r
                 else r["gen_time_s"])
        prev = r.get("gen_last_finish")
        rows.append({
            "iteration": r["iteration"], "forced_length": r["response_len_max"], "t_gen_s": t_gen,
            "gen_span_s": r["gen_time_s"], "t_train_s": r["train_time_s"], "delta_s": t_gen - r["train_time_s"],
            "iteration_time_s": r["iteration_time_s"], "instances": d.get("instances"),
            "delta_prime_s": d.get("delta_prime_s"), "action": d.get("action"),
        })
    return rows


def _mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def summarize(scaled: Path, baseline: Path, window: int, cooldown: int, meta: dict) -> dict:
    events = _jsonl(scaled / "scaleout.jsonl")
    outs = [e for e in events if e["event"] == "scale_out"]
    rows, base = per_iteration(scaled), per_iteration(baseline)
    by_it = {r["iteration"]: r for r in rows}
    base_by_it = {r["iteration"]: r for r in base}
    result: dict = {
        **meta,
        "scaleout_events": [e["iteration"] for e in outs],
        "delta_before_s": None, "delta_after_s": None, "throughput_after_vs_before": None,
        "definitions": {
            "delta_s": "T_gen - T_train of one iteration: T_gen = its generation time net of overlap with the previous "
                       "iteration (allocator.scaleout.generation_time: last sample finish - max(first sample start, "
                       "previous iteration's last finish)), T_train = the trainer's busy time (train_time_s); "
                       "gen_span_s = the plain first-start to last-finish span",
            "delta_prime_s": "the policy's estimate of the generation time one more instance saves: "
                             "mean T_gen over its window / (n + 1)",
            "scaleout_events": "iterations after which the controller decided to add an SGS instance",
            "delta_before_s": f"mean delta over the {window} iterations up to and including the first event "
                              "(the window that triggered it)",
            "delta_after_s": f"mean delta over the first {window} iterations measured with the added instance: "
                             f"after the iteration during which it joined the router plus a cooldown of {cooldown}",
            "baseline_*": "the same quantity over the same iterations of the baseline run (same ramp, controller off)",
            "throughput_after_vs_before": "generated tokens/s (samples x forced length / iteration time) over the "
                                          "after-window divided by that over the before-window, in the scale-out run; "
                                          "the baseline's over the same iterations beside it (the ramp alone)",
        },
    }
    if outs:
        first = outs[0]["iteration"]
        joined = max(first, _joined_at(events, outs[0]))
        before = [by_it[k]["delta_s"] for k in range(first - window + 1, first + 1) if k in by_it]
        after_its = [k for k in sorted(by_it) if k > joined + cooldown][:window]
        result.update({
            "joined_after_iteration": joined,
            "instance_start_s": outs[0]["start_s"],
            "delta_before_s": _mean(before),
            "delta_after_s": _mean([by_it[k]["delta_s"] for k in after_its]),
            "after_iterations": after_its,
            "baseline_delta_before_s": _mean([base_by_it[k]["delta_s"] for k in range(first - window + 1, first + 1)
                                              if k in base_by_it]),
            "baseline_delta_after_s": _mean([base_by_it[k]["delta_s"] for k in after_its if k in base_by_it]),
        })
        before_its = [k for k in range(first - window + 1, first + 1) if k in by_it]
        result.update(throughput_windows(by_it, base_by_it, before_its, after_its, meta.get("samples_per_iteration")))
        tail = [k for k in sorted(by_it) if k > joined + cooldown and k in base_by_it]
        if tail:
            ours = sum(by_it[k]["iteration_time_s"] for k in tail)
            theirs = sum(base_by_it[k]["iteration_time_s"] for k in tail)
            result["iteration_time_after_s"] = {"scaleout": ours, "baseline": theirs, "iterations": tail}
            result["speedup_after_join"] = theirs / ours
    wall = {name: sum(r["iteration_time_s"] for r in rs) for name, rs in (("scaleout", rows), ("baseline", base))}
    result["rl_wall_s"] = wall
    result["rl_wall_speedup"] = wall["baseline"] / wall["scaleout"] if wall["scaleout"] else None
    result["iterations"] = rows
    result["baseline_iterations"] = base
    return result


def throughput_windows(by_it: dict, base_by_it: dict, before: list[int], after: list[int], samples: int | None) -> dict:
    """Generated tokens per second (samples x forced length / iteration time) over the iterations
    ``before`` the event and ``after`` the join, in both runs; their ratios (after / before)."""
    if not samples or not before or not after:
        return {}

    def rate(rows: dict, its: list[int]) -> float | None:
        its = [k for k in its if k in rows]
        wall = sum(rows[k]["iteration_time_s"] for k in its)
        return sum(samples * rows[k]["forced_length"] for k in its) / wall if its and wall > 0 else None

    ours = {"before": rate(by_it, before), "after": rate(by_it, after)}
    theirs = {"before": rate(base_by_it, before), "after": rate(base_by_it, after)}
    ratio = lambda d: d["after"] / d["before"] if d["after"] and d["before"] else None  # noqa: E731
    return {"tokens_per_s": {"scaleout": ours, "baseline": theirs},
            "throughput_after_vs_before": ratio(ours), "baseline_throughput_after_vs_before": ratio(theirs)}


def _joined_at(events: list[dict], out: dict) -> int:
    """The last iteration the controller had read when the instance joined (its cooldown origin)."""
    read = [e["iteration"] for e in events if e["event"] == "decision" and e["t"] <= out["t"]]
    return max(read) if read else out["iteration"]


def markdown(r: dict) -> str:
    f = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    lines = [
        "# Dynamic scale-out (StreamRL Figure 11), real processes on this machine",
        "",
        *([provenance_line(r["provenance"]), ""] if "provenance" in r else []),
        f"{r['mode']} run, forced output length {r['ramp']}, {r.get('regime', 'generation.num_blocks=512')}; "
        f"host: {r['host']} (shared, noisy: compare columns).",
        *([f"Previous regime ({r['previous_regime']['regime']}, {r['previous_regime']['commit'][:12]}): scale-out "
           f"events {r['previous_regime']['scaleout_events']}."] if r.get("previous_regime") else []),
        "",
        f"Scale-out events after iterations {r['scaleout_events']}"
        + (f"; the instance took {r['instance_start_s']:.1f}s to start and joined after iteration "
           f"{r['joined_after_iteration']}." if r["scaleout_events"] else "."),
        "",
        "| | with scale-out | baseline (same ramp, controller off) |",
        "|---|---|---|",
        f"| delta before (s, iterations up to the event) | {f(r['delta_before_s'])} "
        f"| {f(r.get('baseline_delta_before_s'))} |",
        f"| delta after (s, iterations {r.get('after_iterations')}) | {f(r['delta_after_s'])} "
        f"| {f(r.get('baseline_delta_after_s'))} |",
    ]
    if "iteration_time_after_s" in r:
        it = r["iteration_time_after_s"]
        lines.append(f"| iteration time after the join (s, sum) | {f(it['scaleout'])} | {f(it['baseline'])} "
                     f"(**{r['speedup_after_join']:.2f}x** with scale-out) |")
    if r.get("throughput_after_vs_before") is not None:
        tp = r["tokens_per_s"]
        lines.append(f"| generated tokens/s before -> after | {f(tp['scaleout']['before'])} -> "
                     f"{f(tp['scaleout']['after'])} (**{r['throughput_after_vs_before']:.2f}x**) "
                     f"| {f(tp['baseline']['before'])} -> {f(tp['baseline']['after'])} "
                     f"({f(r['baseline_throughput_after_vs_before'])}x) |")
    lines.append(f"| RL wall time (s, all iterations) | {f(r['rl_wall_s']['scaleout'])} "
                 f"| {f(r['rl_wall_s']['baseline'])} |")
    lines += ["", "| iteration | length | T_gen | T_train | delta | delta' | instances | action | baseline delta |",
              "|---|---|---|---|---|---|---|---|---|"]
    base = {b["iteration"]: b for b in r["baseline_iterations"]}
    for x in r["iterations"]:
        b = base.get(x["iteration"], {})
        lines.append(f"| {x['iteration']} | {x['forced_length']} | {f(x['t_gen_s'])} | {f(x['t_train_s'])} "
                     f"| {f(x['delta_s'])} | {f(x['delta_prime_s'])} | {x['instances']} | {x['action']} "
                     f"| {f(b.get('delta_s'))} |")
    lines += ["", "Definitions: " + "; ".join(f"`{k}`: {v}" for k, v in r["definitions"].items()) + "."]
    return "\n".join(lines) + "\n"


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    its = [x["iteration"] for x in r["iterations"]]
    ax.plot(its, [x["delta_s"] for x in r["iterations"]], "o-", label="delta = T_gen - T_train (scale-out on)")
    ax.plot([b["iteration"] for b in r["baseline_iterations"]], [b["delta_s"] for b in r["baseline_iterations"]],
            "s--", color="grey", label="delta, baseline (controller off)")
    dp = [(x["iteration"], x["delta_prime_s"]) for x in r["iterations"] if x["delta_prime_s"] is not None]
    if dp:
        ax.plot(*zip(*dp, strict=True), ":", color="tab:green", label="delta' = T_gen / (n + 1) (window mean)")
    for k, e in enumerate(r["scaleout_events"]):
        ax.axvline(e, color="tab:red", alpha=0.7, label="scale-out decision" if k == 0 else None)
    if r.get("joined_after_iteration") is not None:
        ax.axvline(r["joined_after_iteration"], color="tab:red", ls="--", alpha=0.5, label="instance joined")
    ax.set_xlabel("iteration (forced output length grows linearly)")
    ax.set_ylabel("seconds")
    ax.set_title("SGS scale-out when delta >= delta' (StreamRL Fig. 11 analogue, CPU)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = RecordParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="14 iterations, steeper ramp (under 5 minutes)")
    parser.add_argument("--config", default=str(ROOT / "deploy/configs/default.yaml"))
    parser.add_argument("--work", default=str(ROOT / "runs" / "bench-scaleout"))
    parser.add_argument("--out", default=None, help="default bench/results (--quick: /tmp/braid-bench-quick)")
    ns = parser.parse_args()

    from services.common.config import load_config
    from services.policy.warmstart import ensure_warmstart

    ramp = QUICK if ns.quick else FULL
    base = BASE + ramp
    cfg = load_config(ns.config, [*base, "scaleout.enabled=true"])
    checkpoint = str(ensure_warmstart(cfg, progress=False).resolve())
    work = Path(ns.work)
    t0 = time.time()
    scaled = run("scaleout", [*base, "scaleout.enabled=true"], ns.config, work, checkpoint)
    baseline = run("baseline", base, ns.config, work, checkpoint)
    r0 = cfg.forced_length_ramp
    meta = {
        "mode": "quick" if ns.quick else "full",
        "ramp": f"{r0.start} + {r0.per_iteration:g} x iteration tokens over {cfg.trainer.iterations} iterations",
        "samples_per_iteration": cfg.trainer.prompts_per_iteration * cfg.trainer.group_size,
        "host": f"{platform.machine()}, {os.cpu_count()} cores, CPU only",
        "bench_wall_s": None,
    }
    result = summarize(scaled, baseline, cfg.scaleout.window, cfg.scaleout.cooldown, meta)
    result["bench_wall_s"] = time.time() - t0
    result["regime"] = REGIME
    out = results_dir(ns.out, ns.quick)
    previous = json.loads((out / "scaleout.json").read_text()) if (out / "scaleout.json").is_file() else None
    if previous and previous.get("regime") != REGIME:  # a changed definition keeps the old result beside
        result["previous_regime"] = {**{k: previous.get(k) for k in PREVIOUS_KEYS},
                                     "regime": previous.get("regime") or "generation.num_blocks=512 (16K KV tokens)",
                                     "commit": previous["provenance"]["commit"], "date": previous["provenance"]["date"]}
    elif previous and previous.get("previous_regime"):  # a re-run of the same regime keeps the older one too
        result["previous_regime"] = previous["previous_regime"]
    result["provenance"] = provenance(Path(__file__), {"config": cfg.model_dump(mode="json"), "overrides": base},
                                      Path(ns.config), cfg.generation.engine)
    print(write_results(out, "scaleout", result, markdown, plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
