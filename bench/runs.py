"""Convergence of the runs Braid ships, each through ``braid run`` as a user starts it (issue 34).

The shipped runs, declared here before anything runs, with the claim each must meet:

- ``make_run``: ``deploy/configs/default.yaml`` (what ``make run`` runs: 200 one-step GRPO iterations
  of the tiny policy on the count-down task, 500 held-out prompts);
- ``agentic``: ``deploy/configs/agentic.yaml`` (multi-turn calculator episodes, 1000 held-out episodes);
- ``two_rank``: ``default.yaml`` with ``trainer.ranks=2`` (FSDP2 over gloo, the same run on 2 ranks);
- ``real_model``: ``deploy/configs/smollm2-arith.yaml`` (SmolLM2-135M-Instruct on the arithmetic
  word questions, 1000 held-out questions).

Each run's ``summary.json`` gives the held-out accuracy of the warm start and of the trained policy
(pass@1 at the training temperature) with binomial standard errors; the gain is reported in
standard errors of the difference (the two evaluations are independent draws on the same prompts,
so ``se = sqrt(se_before^2 + se_after^2)``, the conservative, unpaired one). Claim: every gain is at
least ``GOAL_SE`` standard errors. One run each (a run is the unit users get; its evaluation's
standard error is the spread reported).

Writes ``bench/results/runs.{json,md,png}``; ``--runs`` measures a subset and carries the others
from the previous file with their own provenance.

    python bench/runs.py [--runs make_run,agentic,two_rank,real_model] [--quick]
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.report_io import (  # noqa: E402
    RecordParser,
    parts_line,
    parts_record,
    provenance,
    provenance_line,
    results_dir,
    write_results,
)

GOAL_SE = 3.0  # every shipped run's held-out gain, in standard errors of the difference
RUNS: dict[str, tuple[str, tuple[str, ...]]] = {
    "make_run": ("deploy/configs/default.yaml", ()),
    "agentic": ("deploy/configs/agentic.yaml", ()),
    "two_rank": ("deploy/configs/default.yaml", ("trainer.ranks=2",)),
    "real_model": ("deploy/configs/smollm2-arith.yaml", ()),
}
QUICK = ("trainer.iterations=2", "eval.prompts=32")  # a smoke of the same path, never of record
KEYS = ("warmstart_accuracy", "warmstart_stderr", "final_accuracy", "accuracy_stderr", "improvement",
        "eval_prompts", "rl_seconds", "iterations", "mode", "samples_per_second", "eval_fingerprint")


def braid_command() -> list[str]:
    script = Path(sys.executable).parent / "braid"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "flows.cli"]


def run_one(name: str, work: Path, quick: bool) -> dict:
    config, extra = RUNS[name]
    run_id = f"{name}-{int(time.time())}"
    sets = [f"runs_dir={work}", f"run_id={run_id}", *extra, *(QUICK if quick else ())]
    cmd = [*braid_command(), "run", "--config", str(ROOT / config), *(a for s in sets for a in ("--set", s))]
    print(f"[runs] {name}: {' '.join(cmd)}", flush=True)
    t0 = time.time()
    with (work / f"{run_id}.log").open("w") as log:
        done = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    if done.returncode != 0:
        tail = (work / f"{run_id}.log").read_text()[-3000:]
        raise RuntimeError(f"{name}: braid run exited {done.returncode}:\n{tail}")
    summary = json.loads((work / run_id / "summary.json").read_text())
    return {"config": config, "overrides": list(extra), **{k: summary.get(k) for k in KEYS},
            **gain(summary), "wall_s": time.time() - t0, "run_dir": str(work / run_id)}


def gain(summary: dict) -> dict:
    """The gain over the warm start in standard errors of the difference, and the claim's verdict."""
    diff = summary["final_accuracy"] - summary["warmstart_accuracy"]
    se = math.hypot(summary["warmstart_stderr"], summary["accuracy_stderr"])
    z = diff / se if se > 0 else math.inf
    return {"gain": diff, "gain_stderr": se, "gain_in_stderr": z, "goal_met": z >= GOAL_SE}


def markdown(result: dict) -> str:
    lines = ["# Shipped runs: held-out accuracy before and after", "",
             f"Claim declared before the runs: every gain >= {GOAL_SE:g} standard errors of the difference.", "",
             "| run | config | before | after | gain | s.e. | gain / s.e. | goal | RL minutes | provenance |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in result["runs"].items():
        cfg = r["config"] + (f" + {', '.join(r['overrides'])}" if r["overrides"] else "")
        lines.append(f"| {name} | `{cfg}` | {r['warmstart_accuracy']:.3f} ± {r['warmstart_stderr']:.3f} "
                     f"| {r['final_accuracy']:.3f} ± {r['accuracy_stderr']:.3f} | {r['gain']:+.3f} "
                     f"| {r['gain_stderr']:.3f} | {r['gain_in_stderr']:.1f} | {'met' if r['goal_met'] else 'MISSED'} "
                     f"| {r['rl_seconds'] / 60:.1f} | {parts_line(result['parts'], name)} |")
    lines += ["", provenance_line(result["provenance"]), ""]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["runs"])
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for i, name in enumerate(names):
        r = result["runs"][name]
        ax.errorbar([i - 0.12, i + 0.12], [r["warmstart_accuracy"], r["final_accuracy"]],
                    yerr=[r["warmstart_stderr"], r["accuracy_stderr"]], fmt="o-", capsize=4,
                    color="tab:green" if r["goal_met"] else "tab:red")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("held-out accuracy (±1 s.e.)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.set_title("Shipped runs: warm start (left) -> trained (right)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = RecordParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated subset of {','.join(RUNS)}")
    parser.add_argument("--work", default="/tmp/braid-bench-runs", help="where the runs' directories go")
    parser.add_argument("--quick", action="store_true", help="2 iterations each, into a scratch directory")
    parser.add_argument("--out", default=None, help="default bench/results (--quick: /tmp/braid-bench-quick)")
    ns = parser.parse_args(argv)
    names = [n.strip() for n in ns.runs.split(",") if n.strip()]
    unknown = sorted(set(names) - set(RUNS))
    if unknown:
        parser.error(f"unknown runs {unknown}; known: {', '.join(RUNS)}")
    out = results_dir(ns.out, ns.quick)
    prov = provenance(Path(__file__), {"runs": {n: RUNS[n] for n in names}, "goal_se": GOAL_SE, "quick": ns.quick})
    work = Path(ns.work)
    work.mkdir(parents=True, exist_ok=True)
    previous = json.loads((out / "runs.json").read_text()) if (out / "runs.json").is_file() else {}
    runs, seconds = dict(previous.get("runs") or {}), {}
    # each run is a part: measured now, or carried from the previous file with the provenance it had there
    earlier = {**previous.get("runs", {}), "parts": previous.get("parts"), "provenance": previous.get("provenance")}
    result: dict = {}
    for name in names:
        t0 = time.time()
        runs[name] = run_one(name, work, ns.quick)
        seconds[name] = time.time() - t0
        r = runs[name]
        print(f"[runs] {name}: {r['warmstart_accuracy']:.3f} -> {r['final_accuracy']:.3f} "
              f"({r['gain_in_stderr']:.1f} s.e.) in {seconds[name]:.0f} s", flush=True)
        done = {n: runs[n] for n in RUNS if n in runs}
        result = {"goal_se": GOAL_SE, "runs": done, "all_goals_met": all(x["goal_met"] for x in done.values()),
                  "provenance": dict(prov)}
        result["parts"] = parts_record({n: n for n in RUNS}, seconds, earlier, result["provenance"])
        text = write_results(out, "runs", result, markdown, plot)  # after every run: a stopped bench keeps what ran
    print(text)
    return 0 if result["all_goals_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
