"""Bad input, tried at scale (issue 20 item 5): property-based fuzzing of every gRPC method and
every config and data file the CLI reads, with the inputs tried counted.

Starts the stack of ``bench/fuzz_stack.py`` (a weight relay, an SGS instance on the hf engine pulling
from it, the router over the instance: real processes on loopback) and runs each (service, method,
variant) property with ``--examples`` hypothesis examples, then the file properties of
``bench/fuzz_files.py`` with ``--file-examples``. A crash is a service process that died, a reply
UNKNOWN or INTERNAL (an unhandled exception), a status outside the method's allowed set or without
a message, a wait nobody asked for; for files, a traceback or an exit status other than 0 / 2.
It must be 0. Then nothing may be lost: every relay version byte-exact, greedy generation as
before. Writes ``fuzz.json`` and ``fuzz.md`` (``--quick``: a few examples, to a scratch directory).

    python bench/fuzz.py                 # ~10 min on 2 cores
    python bench/fuzz.py --quick
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report_io import provenance, provenance_line, results_dir, write_results  # noqa: E402


def markdown(r: dict) -> str:
    lines = [
        "# Fuzzing: bad input at every gRPC method and every file the CLI reads", "",
        f"{r['inputs_total']} gRPC inputs ({r['examples_per_case']} hypothesis examples per method and variant: "
        f"protobuf messages built to be wrong, raw random bytes) to real processes, and {r['file_inputs_total']} "
        f"broken files; **{r['crashes_total']} crashes**, **{r['file_failures_total']} file failures**; nothing lost: "
        f"{'yes' if r['nothing_lost'].get('greedy_unchanged') else 'NO'} ({r['wall_s']:.0f} s).", "",
        "| service | method | inputs (messages / bytes) | status codes returned | crashes |",
        "|---|---|---|---|---|",
    ]
    for service, s in r["services"].items():
        for method, m in s["methods"].items():
            codes = ", ".join(f"{c} {n}" for c, n in m["codes"].items())
            lines.append(f"| {service} | {method} | {m['inputs']} ({m['by_variant']['message']} / {m['by_variant']['bytes']}) "
                         f"| {codes} | {m['crashes']} |")
        lines.append(f"| **{service}** | all | **{s['inputs']}** | | **{s['crashes']}** |")
    lines += ["", "| file the CLI reads | inputs | accepted | refused with a message | failures |", "|---|---|---|---|---|"]
    for kind, f in r["files"].items():
        lines.append(f"| {kind} | {f['inputs']} | {f['accepted']} | {f['refused']} | {f['failures']} |")
    for crash in r["crashes"] + r["file_failures"]:
        lines += ["", f"- crash: `{str(crash)[:600]}`"]
    return "\n".join(lines + ["", provenance_line(r["provenance"]), ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=800, help="hypothesis examples per (service, method, variant)")
    parser.add_argument("--file-examples", type=int, default=2000, help="hypothesis examples per file kind")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="3 examples per method, 10 per file kind; scratch output")
    parser.add_argument("--out", help="results directory (default bench/results; --quick: a scratch directory)")
    ns = parser.parse_args(argv)
    if ns.quick:
        ns.examples, ns.file_examples = 3, 10

    from bench import fuzz_files
    from bench.fuzz_services import Tally, cases, run_all
    from bench.fuzz_stack import OVERRIDES, Stack, make_checkpoint

    t0 = time.monotonic()
    tally, files = Tally(), fuzz_files.FileTally()
    with tempfile.TemporaryDirectory(prefix="braid-fuzz-") as tmp:
        work = Path(tmp)
        stack = Stack(work / "stack", make_checkpoint(work / "policy")).start()
        try:
            run_all(stack, ns.examples, tally, seed_=ns.seed,
                    progress=lambda s, m, v: print(f"{time.monotonic() - t0:7.1f}s {s}.{m} [{v}] "
                                                   f"{sum(tally.counts[s][m].values())} inputs", flush=True))
            try:
                nothing_lost = stack.check_nothing_lost()
            except AssertionError as err:  # something was lost: a crash of the whole run
                nothing_lost = {"greedy_unchanged": False, "error": str(err)[:2000]}
                tally.crashes.append({"service": "all", "method": "nothing_lost", "variant": "-", "error": str(err)[:2000]})
        finally:
            stack.stop()
        (work / "files").mkdir()
        fuzz_files.run_all(work / "files", ns.file_examples, files, seed_=ns.seed,
                           progress=lambda k, s: print(f"{time.monotonic() - t0:7.1f}s file {k}: {s:.1f}s", flush=True))
    services = tally.summary()
    file_summary = files.summary()
    result = {
        "examples_per_case": ns.examples, "file_examples_per_kind": ns.file_examples, "seed": ns.seed,
        "cases": len(cases()),
        "inputs_total": sum(s["inputs"] for s in services.values()),
        "inputs_per_service": {k: s["inputs"] for k, s in services.items()},
        "crashes_total": len(tally.crashes), "crashes": tally.crashes,
        "services": services, "nothing_lost": nothing_lost,
        "file_inputs_total": sum(f["inputs"] for f in file_summary.values()),
        "file_failures_total": len(files.failures), "file_failures": files.failures, "files": file_summary,
        "seconds_per_method": {k: round(v, 2) for k, v in sorted(tally.seconds.items())},
        "wall_s": time.monotonic() - t0,
    }
    result["provenance"] = provenance(Path(__file__), {"examples": ns.examples, "file_examples": ns.file_examples,
                                                       "seed": ns.seed, "overrides": OVERRIDES}, engine="hf")
    print(write_results(results_dir(ns.out, ns.quick), "fuzz", result, markdown))
    return 0 if result["crashes_total"] == 0 and result["file_failures_total"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
