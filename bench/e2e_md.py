"""Render ``e2e.md`` again from ``e2e.json`` after another benchmark set a block in it.

``bench/trl_fair.py`` and ``bench/e2e_throughput.py`` each set their own block of
``bench/results/e2e.json`` (``trl_fair``, ``throughput_interleaved``, each with its own
``provenance``) and write only the JSON, so ``e2e.md``, rendered when ``bench/e2e.py`` ran,
kept their old numbers; and the file's ``provenance.parts``, written by ``e2e.py`` too, still
names the run each block was carried from then. This renders ``e2e.md`` with
``bench/e2e_report.markdown`` over the JSON as it is, taking each carried block's line of
``parts`` from the block's own provenance (the JSON itself is not touched):

    python bench/e2e_md.py [--results DIR]     # default bench/results
    python bench/e2e_md.py --check             # exit 1 if e2e.md is not what the JSON renders
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.e2e import CARRIED_PARTS  # noqa: E402  (the blocks other scripts set, each with its provenance)
from bench.e2e_report import markdown  # noqa: E402  (the rendering e2e.py uses)


def with_block_parts(result: dict) -> dict:
    """``result`` with each carried block's ``provenance.parts`` line taken from the block's own
    provenance (its script and date); blocks without one, and every other part, as they are."""
    parts = dict(result.get("provenance", {}).get("parts", {}))
    for key, script in CARRIED_PARTS.items():
        date = (result.get(key) or {}).get("provenance", {}).get("date")
        if date:  # the line bench/e2e.py's carry_parts writes, dated by the block's own run
            parts[key] = f"carried from {script} (run of {date})"
    return {**result, "provenance": {**result.get("provenance", {}), "parts": parts}}


def render(results: Path) -> str:
    return markdown(with_block_parts(json.loads((results / "e2e.json").read_text())))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=str(ROOT / "bench" / "results"), help="the folder with e2e.json")
    ap.add_argument("--check", action="store_true", help="compare only; exit 1 when e2e.md differs")
    args = ap.parse_args(argv)
    results = Path(args.results)
    if not (results / "e2e.json").is_file():
        print(f"no e2e.json in {results}", file=sys.stderr)
        return 2
    text, path = render(results), results / "e2e.md"
    if args.check:
        same = path.is_file() and path.read_text() == text
        print(f"{path} {'agrees with' if same else 'differs from'} e2e.json (run bench/e2e_md.py to render it)")
        return 0 if same else 1
    path.write_text(text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
