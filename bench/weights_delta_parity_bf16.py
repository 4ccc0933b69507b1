"""``delta_parity_bf16`` of ``bench/results/weights.json``: runs of ``smollm2-arith.yaml`` with whole
bfloat16 versions and no deltas, the arm that issue 56's parity pool lacked.

The pool (``bench/weights_delta_parity_pool.py``) compares whole float32 versions with deltas in
bfloat16, so two things differ between its arms: deltas, and the dtype of the versions (what
``ServedWeights`` rounds the learner's weights to). Deltas cannot change what is served: every
version a delta rebuilds carries the publisher's digest (``weights.json`` ``delta``). This script
runs the missing arm, ``weights.dtype=bfloat16`` alone: whole versions in bfloat16, otherwise the
pair script's delta run exactly (its config, ``COMMON``, one run after the other from one commit).
The pool then judges deltas on against deltas off at the same dtype, beside its float32 reading.

**Declared before the runs** (2026-12-01, before any run of this arm of record; one indicative run
by ``braid run`` at ``0748f33`` gave 0.756 ± 0.019): the pool's rule, unchanged: with at least
``MIN_RUNS`` finals an arm, the difference of the means, delta - whole bf16, against the standard
error from the runs' spread (``sqrt(sd_a^2 / n_a + sd_b^2 / n_b)``); parity within ``PARITY_SE`` of
it. The delta arm is the pooled pairs' delta runs (their code must be unchanged, as the pool
checks). They ran in earlier sessions, so the arms are not interleaved: the pool page says so.

    python bench/weights_delta_parity_bf16.py [--runs K] [--quick] [--out DIR]

Sets only the key ``delta_parity_bf16`` of ``<out>/weights.json``, after every run (a finished run is
kept if a later one fails or the session ends). A later invocation replaces the key; the pool keeps
each invocation's runs while their code is unchanged (``--add`` for a file written elsewhere).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.report_io import (  # noqa: E402
    RecordParser,
    of_record_or_scratch,
    provenance,
    provenance_line,
    results_dir,
    set_json_key,
)
from bench.weights_delta_parity import COMMON, CONFIG, QUICK, run  # noqa: E402

KEY = "delta_parity_bf16"
ARM = ["weights.dtype=bfloat16"]  # whole versions (no weights.delta), in the delta arm's dtype


def summary_line(entry: dict) -> str:
    finals = ", ".join(f"{r['final_accuracy']:.3f} ± {r['accuracy_stderr']:.3f} ({r['rl_seconds']:.0f} s RL)"
                       for r in entry["runs"])
    return (f"Whole bfloat16 versions (`{' '.join(ARM)}`), `{CONFIG.relative_to(ROOT)}` without its suites: "
            f"{len(entry['runs'])} run(s), finals {finals}. "
            + provenance_line(entry["provenance"]) + (" Quick run (indicative only)." if entry["quick"] else ""))


def main(argv: list[str] | None = None) -> int:
    parser = RecordParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs one after the other (default 3)")
    parser.add_argument("--quick", action="store_true", help="2 iterations, 16 questions, into a scratch directory")
    parser.add_argument("--out", default=None, help="default bench/results (--quick: /tmp/braid-bench-quick)")
    ns = parser.parse_args(argv)
    if ns.runs < 1:
        parser.error("--runs must be at least 1")
    out = results_dir(ns.out, ns.quick)
    declared = {"arm": ARM, "common": COMMON, "quick": ns.quick}
    started = datetime.now(UTC).isoformat(timespec="seconds")  # with the commit, the invocation's id in the pool
    entry: dict = {"arm": ARM, "common": COMMON, "quick": ns.quick, "started": started, "runs": []}
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="braid-delta-parity-bf16-") as tmp:
        for k in range(ns.runs):
            # the pair script's run with its "whole" mode (no extra settings) plus this arm's dtype
            result = run("whole", Path(tmp) / f"run{k}", [*ARM, *(QUICK if ns.quick else [])])
            resolved = json.loads((Path(tmp) / f"run{k}" / "whole" / "config.json").read_text())
            result["weights_settings"] = {s: resolved["weights"].get(s) for s in ("dtype", "delta")}  # what ran
            entry["runs"].append(result)
            entry["seconds"] = round(time.time() - t0, 1)
            entry["provenance"] = provenance(Path(__file__), declared, config_file=CONFIG)
            set_json_key(of_record_or_scratch(out, entry) / "weights.json", KEY, entry)
            print(f"run {k + 1}/{ns.runs}: {result['warmstart_accuracy']:.3f} -> {result['final_accuracy']:.3f} ± "
                  f"{result['accuracy_stderr']:.3f} in {result['wall_s']:.0f} s", flush=True)
    print(summary_line(entry))
    return 0


if __name__ == "__main__":
    sys.exit(main())
