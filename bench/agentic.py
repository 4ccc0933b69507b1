"""Agentic rollouts, side by side in interleaved rounds (RollArt §7.4, issue 21).

Two comparisons, each measured on real agentic training runs (SGS, environment workers and the
trainer as processes; ``deploy/configs/agentic.yaml``'s model, task and warm start) that differ in
one setting only:

- **trajectory vs batch** (RollArt Fig. 12a): ``agentic.interaction=trajectory`` (each trajectory
  steps its environment as soon as its turn is generated) against ``batch`` (a wave of
  trajectories generates turn k, then every environment steps, then turn k + 1), with a per-turn
  environment latency drawn from N(mu, sigma) truncated at 0, at sigma/mu = 0.1, 0.5 and 1.0
  (RollArt: mu = 10 s, sigma 1..10 s; here mu = ``--mu``, 0.5 s by default, so a round fits in
  minutes; generation per turn takes milliseconds on the tiny model, so the environment dominates
  as it does there).
- **redundant vs none** (Fig. 12b): trajectory level at sigma/mu = 1.0 with both of RollArt's
  dimensions of redundancy, ``--redundant-groups`` extra GRPO groups per step
  (``trainer.redundancy_groups``: a step trains the first ``groups`` to fill, the surplus is
  aborted) and ``--redundant`` extra trajectories per group (``agentic.redundant_trajectories``:
  the first ``group_size`` to finish are kept), against none. The redundant variant launches the
  extra environments on top of the same work in flight (its concurrency grows by the same
  factors); the work it throws away is reported beside the speed-up. Redundancy keeps the faster
  episodes and trajectories: a bias toward easy problems that the speed-up does not show.

Both variants of a comparison share everything else: mode ``bounded`` with eta = ``--eta`` (1: for an
agentic run the same as ``one_step``; ``bounded`` admits the redundant groups), so the same
staleness capacity for both, batch size, concurrency, environment workers, latency draws (the
same seed), the SGS engine and the data order. Per run the measure is the **step time**: the
wall time of the iterations after the first ``--warmup`` over their number (start-up excluded;
``--warmup`` and ``--iterations`` even, so batch-level waves of two buffers are counted whole),
and trajectories trained per second over the same window. ``--rounds`` rounds; round r runs
every variant once in rotated order; the ratio of record is the median of the per-round ratios
(batch step time / trajectory step time, none / redundant) with its range and the flag
``spread_as_large_as_effect``.

Writes ``bench/results/agentic.json``/``.md``/``.png`` (``--quick``: /tmp/braid-bench-quick).
Result fields: ``traj_vs_batch`` (keyed by sigma/mu "0.1", "0.5", "1.0": the median ratio),
``redundant_vs_none`` (the median ratio), details under ``traj_vs_batch_detail`` and
``redundant_detail``.

    python bench/agentic.py [--rounds 3] [--iterations 8] [--mu 0.5] [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.report_io import (  # noqa: E402
    RecordParser,
    flagged_ratio,
    provenance,
    provenance_line,
    results_dir,
    round_order,
    write_results,
)

CONFIG = ROOT / "deploy/configs/agentic.yaml"
CVS = ("0.1", "0.5", "1.0")
GOAL = 1.5  # issue 21: trajectory / batch at sigma/mu = 1.0, and the gain grows with the variance
QUICK = {"rounds": 1, "iterations": 6, "warmup": 2, "groups": 4, "cvs": ("1.0",)}


def variants(cvs: tuple[str, ...], redundant: int) -> dict[str, dict]:
    """name -> (interaction, sigma/mu, redundant trajectories per group)."""
    out = {}
    for cv in cvs:
        out[f"traj@{cv}"] = {"interaction": "trajectory", "cv": float(cv), "redundant": 0}
        out[f"batch@{cv}"] = {"interaction": "batch", "cv": float(cv), "redundant": 0}
    if "1.0" in cvs and redundant:
        out["redundant@1.0"] = {"interaction": "trajectory", "cv": 1.0, "redundant": redundant}
    return out


def redundancy_overrides(v: dict, ns) -> list[str]:
    """RollArt's redundant environment rollouts in both of its dimensions (Fig. 12b): more groups
    than a step trains (``trainer.redundancy_groups``: a buffer is Ready once ``groups`` of them are
    in, the surplus is aborted) and more trajectories than a group keeps
    (``agentic.redundant_trajectories``)."""
    if not v["redundant"]:
        return []
    return [f"trainer.redundancy_groups={ns.redundant_groups}", f"agentic.redundant_trajectories={v['redundant']}"]


def overrides(v: dict, ns, r: int) -> list[str]:
    group, groups = ns.group_size, ns.groups + (ns.redundant_groups if v["redundant"] else 0)
    concurrency = 2 * groups * (group + v["redundant"])  # two steps' trajectories in flight (all of eta = 1's room)
    return [*redundancy_overrides(v, ns),
        "trainer.mode=bounded", f"trainer.eta={ns.eta}", f"trainer.iterations={ns.iterations}",
        f"trainer.prompts_per_iteration={ns.groups}",
        f"trainer.group_size={group}", f"trainer.micro_batch_groups={min(ns.groups, 8)}", f"trainer.seed={r}",
        f"eval.prompts={ns.eval_prompts}", "trainer.recovery.every=0",
        f"agentic.interaction={v['interaction']}", f"agentic.redundant_trajectories={v['redundant']}",
        f"agentic.concurrency={concurrency}", f"agentic.workers={ns.workers}",
        "agentic.latency.kind=normal", f"agentic.latency.mean_s={ns.mu}", f"agentic.latency.std_s={v['cv'] * ns.mu}",
        f"agentic.latency.seed={r}", f"agentic.calculator.min_steps={ns.min_steps}",
    ]


def run_metrics(rows: list[dict], warmup: int) -> dict:
    """Time per step (the steady window's wall time over its steps: batch-level waves finish
    several buffers at once, so single steps alternate long and short) and trained trajectories
    per second, over the iterations after ``warmup``."""
    steady = rows[warmup:] if len(rows) > warmup else rows
    times = [r["iteration_time_s"] for r in steady]
    last = rows[-1]
    return {
        "step_time_s": sum(times) / len(times),
        "step_times_s": times,
        "trajectories_per_s": sum(r["trajectories"] for r in steady) / sum(times),
        "turns_mean": statistics.mean(r["turns_mean"] for r in steady),
        "env_latency_s_mean": statistics.mean(r["env_latency_s_mean"] for r in steady),
        "launched": last.get("trajectories_launched", 0),
        "aborted": last.get("trajectories_aborted", 0),
        "aborted_tokens": last.get("aborted_tokens", 0),
        "violations": sum(r["bound_violations"] for r in rows),
    }


def run_one(name: str, v: dict, r: int, ns, checkpoint: str, work: Path) -> dict:
    from flows.launcher import run_processes
    from services.common.config import load_config, write_config

    run_dir = work / f"{name}~r{r}"
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("metrics.jsonl", "trajectories.jsonl", "ledger.jsonl", "summary.json"):
        (run_dir / stale).unlink(missing_ok=True)
    cfg = load_config(CONFIG, overrides(v, ns, r))
    write_config(cfg, run_dir / "config.json")
    (run_dir / "metrics.jsonl").write_text("")
    run_processes(run_dir, checkpoint)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {**run_metrics(rows, ns.warmup), "run_dir": str(run_dir)}


def summarize(runs: dict[str, list[dict]], cvs: tuple[str, ...], redundant: int, redundant_groups: int) -> dict:
    detail = {}
    for cv in cvs:
        t, b = runs[f"traj@{cv}"], runs[f"batch@{cv}"]
        detail[cv] = {"step_time": flagged_ratio([x["step_time_s"] for x in b], [x["step_time_s"] for x in t]),
                      "trajectories_per_s": flagged_ratio([x["trajectories_per_s"] for x in t],
                                                          [x["trajectories_per_s"] for x in b]),
                      "traj_step_time_s": [x["step_time_s"] for x in t],
                      "batch_step_time_s": [x["step_time_s"] for x in b]}
    out = {"traj_vs_batch": {cv: detail[cv]["step_time"]["median"] for cv in cvs}, "traj_vs_batch_detail": detail}
    gains = [out["traj_vs_batch"][cv] for cv in cvs]
    out["gain_grows_with_variance"] = all(a < b for a, b in itertools.pairwise(gains))
    if "1.0" in cvs:
        out["goal"] = GOAL
        out["goal_met"] = out["traj_vs_batch"]["1.0"] >= GOAL and out["gain_grows_with_variance"]
    if "redundant@1.0" in runs:
        red, none = runs["redundant@1.0"], runs["traj@1.0"]
        ratio = flagged_ratio([x["step_time_s"] for x in none], [x["step_time_s"] for x in red])
        out["redundant_vs_none"] = ratio["median"]
        out["redundant_detail"] = {
            "redundant_trajectories_per_group": redundant, "redundant_groups_per_step": redundant_groups,
            "step_time": ratio,
            "trajectories_per_s": flagged_ratio([x["trajectories_per_s"] for x in red],
                                                [x["trajectories_per_s"] for x in none]),
            "aborted_fraction": statistics.median(x["aborted"] / max(1, x["launched"]) for x in red),
            "aborted_tokens_per_run": statistics.median(x["aborted_tokens"] for x in red),
        }
    out["violations"] = sum(x["violations"] for v in runs.values() for x in v)
    return out


def markdown(res: dict) -> str:
    s = res["settings"]
    lines = [
        "# Agentic rollouts: trajectory- vs batch-level environment interaction, redundant rollouts", "",
        f"Real agentic training runs (`deploy/configs/agentic.yaml`: {s['env']} task, {s['engine']} engine), mode "
        f"`bounded` with eta = {s.get('eta', 1)}, {s['groups']} GRPO groups x {s['group_size']} trajectories per step, "
        f"per-turn environment latency N({s['mu']} s, sigma) truncated at 0, {s['workers']} environment workers; "
        f"{s['rounds']} interleaved rounds of {s['iterations']} steps, the first {s['warmup']} not counted. Ratio of "
        f"record: median of the per-round ratios of the time per step [range].", "",
        "| sigma/mu | batch step (s) | trajectory step (s) | trajectory / batch speed-up | trajectories/s ratio "
        "| spread >= effect |",
        "|---|---|---|---|---|---|",
    ]
    for cv, d in res["traj_vs_batch_detail"].items():
        st, tp = d["step_time"], d["trajectories_per_s"]
        lines.append(f"| {cv} | {statistics.median(d['batch_step_time_s']):.2f} "
                     f"| {statistics.median(d['traj_step_time_s']):.2f} "
                     f"| **{st['median']:.2f}x** [{st['min']:.2f}-{st['max']:.2f}] | {tp['median']:.2f}x | "
                     f"{'yes' if st['spread_as_large_as_effect'] else 'no'} |")
    if "goal" in res:
        lines += ["", f"Goal: the gain grows with the variance and is >= {res['goal']}x at sigma/mu = 1: "
                      f"**{'met' if res['goal_met'] else 'missed'}** (grows: {res['gain_grows_with_variance']})."]
    if "redundant_detail" in res:
        d = res["redundant_detail"]
        lines += ["", f"Redundant environment rollouts at sigma/mu = 1.0 ({d['redundant_groups_per_step']} extra "
                      f"groups per step, {d['redundant_trajectories_per_group']} extra trajectories per group; the "
                      f"first to finish are trained, the rest aborted): step-time speed-up "
                      f"**{d['step_time']['median']:.2f}x** [{d['step_time']['min']:.2f}-{d['step_time']['max']:.2f}], "
                      f"trajectories/s {d['trajectories_per_s']['median']:.2f}x; {d['aborted_fraction']:.0%} of the "
                      f"launched trajectories were aborted ({d['aborted_tokens_per_run']:.0f} generated tokens thrown "
                      f"away per run)."]
    lines += ["", f"Staleness violations: {res['violations']}.", "", provenance_line(res["provenance"]), ""]
    return "\n".join(lines)


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    detail = res["traj_vs_batch_detail"]
    cvs = list(detail)
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
    x = range(len(cvs))
    for label, key, color in (("batch level", "batch_step_time_s", "tab:red"),
                              ("trajectory level", "traj_step_time_s", "tab:blue")):
        med = [statistics.median(detail[cv][key]) for cv in cvs]
        lo = [m - min(detail[cv][key]) for m, cv in zip(med, cvs, strict=True)]
        hi = [max(detail[cv][key]) - m for m, cv in zip(med, cvs, strict=True)]
        ax[0].errorbar(x, med, yerr=[lo, hi], fmt="o-", capsize=4, label=label, color=color)
    ax[0].set_xticks(list(x), cvs)
    ax[0].set_xlabel("environment latency sigma / mu")
    ax[0].set_ylabel("step time (s)")
    ax[0].legend()
    ax[0].grid(alpha=0.3)
    ratios = [detail[cv]["step_time"] for cv in cvs]
    ax[1].bar(x, [r["median"] for r in ratios], color="tab:blue", alpha=0.7,
              yerr=[[r["median"] - r["min"] for r in ratios], [r["max"] - r["median"] for r in ratios]], capsize=4)
    ax[1].axhline(1.0, color="gray", lw=1)
    if "goal" in res:
        ax[1].axhline(res["goal"], color="tab:green", ls="--", lw=1, label=f"goal {res['goal']}x at 1.0")
        ax[1].legend()
    ax[1].set_xticks(list(x), cvs)
    ax[1].set_xlabel("environment latency sigma / mu")
    ax[1].set_ylabel("trajectory / batch speed-up")
    ax[1].grid(alpha=0.3, axis="y")
    fig.suptitle("Trajectory-level vs batch-level environment interaction (median of rounds, range)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = RecordParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2, help="iterations not counted at the start of each run")
    parser.add_argument("--groups", type=int, default=8, help="GRPO groups per step")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--mu", type=float, default=0.5, help="mean environment latency per turn (s)")
    parser.add_argument("--min-steps", type=int, default=3, help="fewest calculator subtractions (more turns)")
    parser.add_argument("--redundant", type=int, default=2,
                        help="extra trajectories per group in the redundant variant")
    parser.add_argument("--redundant-groups", type=int, default=2,
                        help="extra groups per step in the redundant variant")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--eval-prompts", type=int, default=8)
    parser.add_argument("--eta", type=int, default=1, help="staleness bound of both variants (bounded mode)")
    parser.add_argument("--cvs", default=",".join(CVS), help="the sigma/mu values, comma-separated")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--work", default=str(ROOT / "runs" / "bench-agentic"))
    parser.add_argument("--out", default=None, help="default bench/results (--quick: /tmp/braid-bench-quick)")
    ns = parser.parse_args()
    cvs = tuple(c.strip() for c in ns.cvs.split(",") if c.strip())
    if ns.quick:
        ns.rounds, ns.iterations, ns.warmup, ns.groups = (QUICK["rounds"], QUICK["iterations"], QUICK["warmup"],
                                                          QUICK["groups"])
        cvs = QUICK["cvs"]
    if ns.rounds < 1 or ns.iterations <= ns.warmup:
        parser.error("--rounds must be >= 1 and --iterations > --warmup")

    from services.common.config import load_config
    from services.policy.warmstart import ensure_warmstart

    base = load_config(CONFIG)
    checkpoint = str(ensure_warmstart(base).resolve())
    plan = variants(cvs, ns.redundant)
    names = list(plan)
    runs: dict[str, list[dict]] = {n: [] for n in names}
    work, t0 = Path(ns.work), time.time()
    for r in range(ns.rounds):
        for name in round_order(names, r):
            done = sum(len(v) for v in runs.values())
            print(f"[{done + 1}/{len(names) * ns.rounds}] round {r}: {name} ({time.time() - t0:.0f}s elapsed)",
                  flush=True)
            runs[name].append(run_one(name, plan[name], r, ns, checkpoint, work))
            print(f"    step {runs[name][-1]['step_time_s']:.2f} s", flush=True)
    res = summarize(runs, cvs, ns.redundant, ns.redundant_groups)
    res["runs"] = runs
    res["settings"] = {"eta": ns.eta, "env": base.agentic.env, "engine": base.generation.engine, "groups": ns.groups,
                       "group_size": ns.group_size, "mu": ns.mu, "workers": ns.workers, "rounds": ns.rounds,
                       "iterations": ns.iterations, "warmup": ns.warmup, "min_steps": ns.min_steps,
                       "wall_s": time.time() - t0}
    res["provenance"] = provenance(Path(__file__), {"settings": res["settings"], "variants": plan},
                                   CONFIG, base.generation.engine)
    print(write_results(results_dir(ns.out, ns.quick), "agentic", res, markdown, plot))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
