"""Headline numbers in the prose, checked against the results files they come from.

A number quoted in README.md, bench/README.md or docs/*.md from a benchmark carries an invisible
marker right after it (before any unit):

    one_step **1.88<!--@pipeline.json speedup_one_step_vs_sequential.median .2f-->x** sequential

``check(text)`` formats the value at that key path of ``bench/results/<file>`` with the format
spec and reports every marker whose number in the text differs, or whose file or key is gone.
``tests/unit/test_headlines.py`` runs it over those documents, so a re-run benchmark
whose numbers moved fails the tests until the prose says what the results say.

    python bench/headlines.py            # list every marked number and whether it agrees
    python bench/headlines.py --fix      # rewrite each disagreeing number to the results' value

``--fix`` changes only the marked numbers: the words around them (a range, "met", "missed", a
comparison) are the writer's to re-read, and it prints every line it changed for that.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
MARKER = re.compile(r"<!--@(?P<file>[\w.-]+\.json) (?P<key>[^\s>]+) (?P<fmt>[^\s>]+)-->")
UNITS = " x*"  # what may stand between the number and its marker
NUMBER = re.compile(r"[-+]?(?:\d[\d,]*)?\.?\d+%?$")  # a quoted number, at the end of the text before a marker
DOCS = ("README.md", "bench/README.md", "docs/*.md")  # every document that quotes results


@dataclass(frozen=True)
class Headline:
    where: str  # path:line
    file: str
    key: str
    fmt: str
    quoted: str  # the text just before the marker
    expected: str | None  # the formatted value; None when the file or key is missing
    problem: str = ""

    @property
    def ok(self) -> bool:
        return not self.problem


def lookup(data, key: str):
    """``a.b.0.c`` into nested dicts and lists; a dict key that itself holds dots
    (``planned_vs_even_speedup.Qwen2.5-72B``) is found by joining the parts that follow."""
    parts = key.split(".")
    i = 0
    while i < len(parts):
        if isinstance(data, list):
            data, i = data[int(parts[i])], i + 1
            continue
        for j in range(i + 1, len(parts) + 1):
            if ".".join(parts[i:j]) in data:
                data, i = data[".".join(parts[i:j])], j
                break
        else:
            raise KeyError(parts[i])
    return data


def _judge(file: str, key: str, fmt: str, before: str, results: Path) -> tuple[str | None, str]:
    path = results / file
    if not path.is_file():
        return None, f"no results file {file}"
    try:
        value = lookup(json.loads(path.read_text()), key)
        expected = format(value, fmt)
    except (KeyError, IndexError, ValueError, TypeError) as err:
        return None, f"{file} has no number at {key} ({type(err).__name__}: {err})"
    quoted = before.rstrip(UNITS)
    start = len(quoted) - len(expected)
    if not quoted.endswith(expected) or (start > 0 and (quoted[start - 1].isdigit() or quoted[start - 1] == ".")):
        return expected, f"the text says {quoted[-12:]!r}, {file} {key} is {expected}"
    return expected, ""


def _judged(text: str, results: Path):
    """Each marker of ``text`` with the text just before it, its formatted value and its problem."""
    for m in MARKER.finditer(text):
        before = text[max(0, m.start() - 40) : m.start()]
        yield (m, before, *_judge(m["file"], m["key"], m["fmt"], before, results))


def check(text: str, where: str = "", results: Path = RESULTS) -> list[Headline]:
    """Every marked number in ``text`` against its results file."""
    out = []
    for m, before, expected, problem in _judged(text, results):
        line = text.count("\n", 0, m.start()) + 1
        quoted = before.rstrip(UNITS)[-12:]
        out.append(Headline(f"{where}:{line}", m["file"], m["key"], m["fmt"], quoted, expected, problem))
    return out


def fix(text: str, results: Path = RESULTS) -> tuple[str, list[str]]:
    """``text`` with every disagreeing marked number replaced by its results' value, and a line per
    change (``old -> new`` with the marker's key). A marker whose file or key is missing, or with no
    number before it, is left for the writer."""
    out, changes, pos = [], [], 0
    for m, _, expected, problem in _judged(text, results):
        stripped = text[pos : m.start()].rstrip(UNITS)
        number = NUMBER.search(stripped)
        if problem and expected is not None and number:
            out.append(text[pos : pos + number.start()] + expected + text[pos + len(stripped) : m.end()])
            changes.append(f"{m['file']} {m['key']}: {number.group()} -> {expected}")
        else:
            out.append(text[pos : m.end()])
        pos = m.end()
    return "".join(out) + text[pos:], changes


def documents(root: Path = ROOT) -> list[Path]:
    return sorted(p for pattern in DOCS for p in root.glob(pattern))


def check_all(root: Path = ROOT) -> list[Headline]:
    results = root / "bench" / "results"
    return [h for doc in documents(root) for h in check(doc.read_text(), str(doc.relative_to(root)), results)]


def main() -> int:
    if "--fix" in sys.argv[1:]:
        for doc in documents():
            text, changes = fix(doc.read_text())
            if changes:
                doc.write_text(text)
                print("\n".join(f"fixed {doc.relative_to(ROOT)}: {c}" for c in changes))
    headlines = check_all()
    for h in headlines:
        problem = f"  ({h.problem})" if h.problem else ""
        print(f"{'ok ' if h.ok else 'BAD'} {h.where}: {h.file} {h.key} = {h.expected}{problem}")
    bad = sum(not h.ok for h in headlines)
    print(f"{len(headlines)} marked numbers, {bad} disagree")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
