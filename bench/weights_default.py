"""Does the relay weight transport slow the default run? ``direct`` vs ``relay``, side by side.

The default config (``deploy/configs/default.yaml``, ``one_step``) shortened to ``--iterations``
RL iterations and 64 evaluation prompts, run through the same launcher as ``make run`` (no
Prefect), alternating the two transports ``--reps`` times. Reports the mean ``iteration_time_s``
(after the first iteration) and ``push_stall_s`` of each run, and relay / direct.
Writes ``weights_default_run.json`` (with its ``provenance``) to ``bench/results``, or ``--out``;
``--quick`` (one pair of 4-iteration runs) writes to a scratch directory, never over the results
of record.

    python bench/weights_default.py [--iterations 20] [--reps 2] [--quick] [--out DIR]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.report_io import RecordParser, provenance, results_dir  # noqa: E402

CONFIG = ROOT / "deploy/configs/default.yaml"


def main(argv: list[str] | None = None) -> int:
    parser = RecordParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--runs-dir", default="/tmp/braid-weights-default")
    parser.add_argument("--quick", action="store_true", help="one pair of 4-iteration runs, into a scratch directory")
    parser.add_argument("--out", default=None, help="default bench/results (--quick: /tmp/braid-bench-quick)")
    ns = parser.parse_args(argv)
    if ns.quick:
        ns.iterations, ns.reps = 4, 1
    out_dir = results_dir(ns.out, ns.quick)
    from flows.launcher import run_processes
    from services.common.config import load_config, write_config
    from services.policy.warmstart import ensure_warmstart

    out: dict[str, list[dict]] = {"direct": [], "relay": []}
    for rep in range(ns.reps):
        for transport in ("direct", "relay"):
            run_id = f"{transport}-{rep}-{int(time.time())}"
            cfg = load_config(CONFIG, [
                f"weights.transport={transport}", f"trainer.iterations={ns.iterations}", "eval.prompts=64",
                f"run_id={run_id}", f"runs_dir={ns.runs_dir}", f"cache_dir={ROOT / '.cache'}",
            ])
            run_dir = Path(cfg.runs_dir) / run_id
            run_dir.mkdir(parents=True)
            write_config(cfg, run_dir / "config.json")
            (run_dir / "metrics.jsonl").write_text("")
            run_processes(run_dir, str(ensure_warmstart(cfg)))
            rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
            out[transport].append({
                "iteration_time_s": statistics.mean(r["iteration_time_s"] for r in rows[1:]),
                "push_stall_s": statistics.mean(r["push_stall_s"] for r in rows),
            })
            print(transport, rep, out[transport][-1], flush=True)
    mean = {k: statistics.mean(r["iteration_time_s"] for r in v) for k, v in out.items()}
    engine = load_config(CONFIG).generation.engine
    result = {"provenance": provenance(Path(__file__), {"iterations": ns.iterations, "reps": ns.reps, "quick": ns.quick,
                                                        "eval_prompts": 64}, CONFIG, engine),
              "runs": out, "mean_iteration_time_s": mean, "relay_vs_direct": mean["relay"] / mean["direct"],
              "iterations": ns.iterations, "reps": ns.reps, "quick": ns.quick,
              "note": f"shared, noisy 2-core machine (load average {os.getloadavg()[0]:.1f} at the end); "
                      "runs alternate"}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "weights_default_run.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["mean_iteration_time_s"]), f"relay/direct {result['relay_vs_direct']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
