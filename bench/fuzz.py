"""Bad input, tried at scale (issue 20 item 5): property-based fuzzing of every gRPC method and
every config and data file the CLI reads, with the inputs tried counted.

Starts the stack of ``bench/fuzz_stack.py`` (a weight relay, an SGS instance on the hf engine pulling
from it, the router over the instance, an environment worker and a reward worker: real processes on
loopback) and runs each (service, method,
variant) property with ``--examples`` hypothesis examples, then the file properties of
``bench/fuzz_files.py`` with ``--file-examples``. A crash is a service process that died, a reply
UNKNOWN or INTERNAL (an unhandled exception), a status outside the method's allowed set or without
a message, a wait nobody asked for; for files, a traceback or an exit status other than 0 / 2.
It must be 0. Then nothing may be lost: every relay version byte-exact, greedy generation as
before, each environment kind's expert episode played and scored as before. Writes ``fuzz.json``
and ``fuzz.md`` (``--quick``: a few examples, to a scratch directory).

    python bench/fuzz.py                 # ~10 min on 2 cores
    python bench/fuzz.py --quick
    python bench/fuzz.py --parts files   # only the files (~2 min); the gRPC part is carried, marked so
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
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

PARTS = {"services": "services", "files": "files"}  # part -> its section of the results
PART_KEYS = {  # every key a part writes: a partial rerun carries the other part's
    "services": ("examples_per_case", "cases", "inputs_total", "inputs_per_service", "crashes_total", "crashes",
                 "services", "nothing_lost", "seconds_per_method"),
    "files": ("file_examples_per_kind", "file_inputs_total", "file_failures_total", "file_failures", "files"),
}


def markdown(r: dict) -> str:
    lines = [
        "# Fuzzing: bad input at every gRPC method and every file the CLI reads", "",
        f"{r['inputs_total']} gRPC inputs ({r['examples_per_case']} hypothesis examples per method and variant: "
        f"protobuf messages built to be wrong, raw random bytes) to real processes, and {r['file_inputs_total']} "
        f"broken files; **{r['crashes_total']} crashes**, **{r['file_failures_total']} file failures**; nothing lost: "
        f"""{'yes' if r['nothing_lost'].get('greedy_unchanged')
             and r['nothing_lost'].get('episode_unchanged', True) else 'NO'}"""
        f" ({r['wall_s']:.0f} s).", "",
        parts_line(r.get("parts", {}), "services"), "",
        "| service | method | inputs (messages / bytes) | status codes returned | crashes |",
        "|---|---|---|---|---|",
    ]
    for service, s in r["services"].items():
        for method, m in s["methods"].items():
            codes = ", ".join(f"{c} {n}" for c, n in m["codes"].items())
            lines.append(f"| {service} | {method} "
                         f"| {m['inputs']} ({m['by_variant']['message']} / {m['by_variant']['bytes']}) | {codes} "
                         f"| {m['crashes']} |")
        lines.append(f"| **{service}** | all | **{s['inputs']}** | | **{s['crashes']}** |")
    lines += ["", parts_line(r.get("parts", {}), "files"), "",
              "| file the CLI reads | inputs | accepted | refused with a message | failures |", "|---|---|---|---|---|"]
    for kind, f in r["files"].items():
        lines.append(f"| {kind} | {f['inputs']} | {f['accepted']} | {f['refused']} | {f['failures']} |")
    for crash in r["crashes"] + r["file_failures"]:
        lines += ["", f"- crash: `{str(crash)[:600]}`"]
    return "\n".join([*lines, "", provenance_line(r["provenance"]), ""])


def run_services(ns: argparse.Namespace, t0: float) -> dict:
    """The gRPC part: the stack of real processes, every (service, method, variant), nothing lost."""
    from bench.fuzz_services import Tally, cases, run_all
    from bench.fuzz_stack import Stack, make_checkpoint

    tally = Tally()
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
                tally.crashes.append({"service": "all", "method": "nothing_lost", "variant": "-",
                                      "error": str(err)[:2000]})
        finally:
            stack.stop()
    services = tally.summary()
    return {
        "examples_per_case": ns.examples, "cases": len(cases()),
        "inputs_total": sum(s["inputs"] for s in services.values()),
        "inputs_per_service": {k: s["inputs"] for k, s in services.items()},
        "crashes_total": len(tally.crashes), "crashes": tally.crashes,
        "services": services, "nothing_lost": nothing_lost,
        "seconds_per_method": {k: round(v, 2) for k, v in sorted(tally.seconds.items())},
    }


def run_files(ns: argparse.Namespace, t0: float) -> dict:
    """The file part: every config and data file the CLI reads, broken by hypothesis."""
    from bench import fuzz_files

    files = fuzz_files.FileTally()
    with tempfile.TemporaryDirectory(prefix="braid-fuzz-files-") as tmp:
        fuzz_files.run_all(Path(tmp), ns.file_examples, files, seed_=ns.seed,
                           progress=lambda k, s: print(f"{time.monotonic() - t0:7.1f}s file {k}: {s:.1f}s", flush=True))
    file_summary = files.summary()
    return {
        "file_examples_per_kind": ns.file_examples,
        "file_inputs_total": sum(f["inputs"] for f in file_summary.values()),
        "file_failures_total": len(files.failures), "file_failures": files.failures, "files": file_summary,
    }


def main(argv: list[str] | None = None) -> int:
    parser = RecordParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=800, help="hypothesis examples per (service, method, variant)")
    parser.add_argument("--file-examples", type=int, default=2000, help="hypothesis examples per file kind")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--parts", nargs="+", choices=sorted(PARTS), default=sorted(PARTS),
                        help="parts to run (default both); a part not run is carried from the results file, marked so")
    parser.add_argument("--quick", action="store_true", help="3 examples per method, 10 per file kind; scratch output")
    parser.add_argument("--out", help="results directory (default bench/results; --quick: a scratch directory)")
    ns = parser.parse_args(argv)
    if ns.quick:
        ns.examples, ns.file_examples = 3, 10
    from bench.fuzz_stack import OVERRIDES

    out = results_dir(ns.out, ns.quick)
    previous = json.loads((out / "fuzz.json").read_text()) if (out / "fuzz.json").is_file() else {}
    missing = [p for p in PARTS if p not in ns.parts and PARTS[p] not in previous]
    if missing:
        raise SystemExit(f"--parts {' '.join(ns.parts)}: {out / 'fuzz.json'} has no {', '.join(missing)} part to carry")
    t0 = time.monotonic()
    result: dict = {"seed": ns.seed}
    measured: dict[str, float] = {}
    for part, run in (("services", run_services), ("files", run_files)):
        if part in ns.parts:
            t_part = time.monotonic()
            result.update(run(ns, t0))
            measured[part] = round(time.monotonic() - t_part, 1)
        else:  # carried from the results of record, as they were
            result.update({k: previous[k] for k in PART_KEYS[part] if k in previous})
    result["wall_s"] = time.monotonic() - t0
    result["provenance"] = provenance(Path(__file__), {"examples": ns.examples, "file_examples": ns.file_examples,
                                                       "seed": ns.seed, "overrides": OVERRIDES,
                                                       "parts": sorted(ns.parts)}, engine="hf")
    result["parts"] = parts_record(PARTS, measured, previous, result["provenance"])
    print(write_results(out, "fuzz", result, markdown))
    return 0 if result["crashes_total"] == 0 and result["file_failures_total"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
