"""Every results file of record says where it came from (issue 19 item 4).

Each ``bench/results/*.json`` carries ``provenance`` with the commit, the dirty flag, the config
hash, the generation engine (null where none is involved, but the key is there), the machine and
the date, and says whether it was measured in the run that wrote it; a benchmark that can carry
parts from an earlier run (``bench/weights.py --parts``) marks each part measured or carried, and
from which run. ``--quick`` runs go to a scratch directory, never over these files.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from datetime import datetime
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.report_io import QUICK_OUT, RESULTS, results_dir  # noqa: E402

RESULT_FILES = sorted(RESULTS.glob("*.json"))
HEX40 = re.compile(r"[0-9a-f]{40}")
# benchmarks that can carry parts from the results file they replace: file -> part -> its key in the results
PARTED = {"weights.json": {"a": "throughput", "b": "broadcast", "c": "stall", "d": "cross_site"},
          "fuzz.json": {"services": "services", "files": "files"},
          "fleet.json": {k: k for k in ("dispatch", "async", "repack", "scaleout", "cross_site")}}


def provenance_problems(data) -> list[str]:
    """What is missing or malformed in a results file's ``provenance`` (empty: nothing)."""
    if not isinstance(data, dict) or not isinstance(data.get("provenance"), dict):
        return ["no provenance block"]
    p, bad = data["provenance"], []
    if not (isinstance(p.get("commit"), str) and HEX40.fullmatch(p["commit"])):
        bad.append(f"commit {p.get('commit')!r} is not 40 hex digits")
    if not isinstance(p.get("dirty"), bool):
        bad.append(f"dirty {p.get('dirty')!r} is not a bool")
    if not (isinstance(p.get("config_hash"), str) and p["config_hash"]):
        bad.append("no config_hash")
    if "engine" not in p:
        bad.append("no engine key (null where no engine is involved)")
    m = p.get("machine")
    if not (isinstance(m, dict) and m.get("cpu")
            and isinstance(m.get("cores"), int) and isinstance(m.get("mem_gb"), (int, float))):
        bad.append(f"machine {m!r} lacks cpu, cores or mem_gb")
    try:
        date = datetime.fromisoformat(p["date"])
        if date.tzinfo is None:
            bad.append(f"date {p['date']!r} has no time zone")
    except (KeyError, TypeError, ValueError):
        bad.append(f"date {p.get('date')!r} is not ISO 8601")
    if not isinstance(p.get("measured_in_this_run"), bool):
        bad.append("measured_in_this_run is not a bool")
    elif not p["measured_in_this_run"] and not (data.get("parts") or p.get("source_runs") or p.get("carried_from")):
        bad.append("not measured in this run, and nothing says where it was carried from")
    return bad


def parts_problems(data, parts: dict[str, str]) -> list[str]:
    """Every part present in the results is marked measured in this run, or carried from a named run."""
    marks, bad = data.get("parts"), []
    if not isinstance(marks, dict):
        return ["no parts map"]
    for part, key in parts.items():
        if key not in data:
            continue
        mark = marks.get(part)
        if not isinstance(mark, dict) or not isinstance(mark.get("measured_in_this_run"), bool):
            bad.append(f"part {part} ({key}) is not marked measured or carried")
        elif not mark["measured_in_this_run"]:
            src = mark.get("carried_from") or {}
            if not (src.get("commit") and src.get("date")) and not src.get("note"):
                bad.append(f"part {part} is carried but says not from which run")
    measured = [m.get("measured_in_this_run") for m in marks.values() if isinstance(m, dict)]
    if data.get("provenance", {}).get("measured_in_this_run") is not (bool(measured) and all(measured)):
        bad.append("provenance.measured_in_this_run disagrees with the parts")
    return bad


def test_there_are_results_files():
    assert len(RESULT_FILES) >= 10


@pytest.mark.parametrize("path", RESULT_FILES, ids=lambda p: p.name)
def test_results_file_has_provenance(path):
    assert provenance_problems(json.loads(path.read_text())) == []


@pytest.mark.parametrize("name", sorted(PARTED))
def test_parted_results_mark_each_part(name):
    assert parts_problems(json.loads((RESULTS / name).read_text()), PARTED[name]) == []


GOOD = {"provenance": {"commit": "0123456789abcdef0123456789abcdef01234567", "dirty": False, "config_hash": "c0ffee",
                       "engine": None, "machine": {"cpu": "Intel(R) Xeon(R) Processor", "cores": 2, "mem_gb": 23.5},
                       "date": "2026-11-25T12:00:00+00:00", "measured_in_this_run": True},
        "throughput": {}, "broadcast": {}, "stall": {}, "cross_site": {},
        "parts": {k: {"measured_in_this_run": True} for k in "abcd"}}


def test_the_checks_can_fail():
    assert provenance_problems(GOOD) == [] and parts_problems(GOOD, PARTED["weights.json"]) == []
    assert provenance_problems({"speedup": 1.2}) == ["no provenance block"]
    good = GOOD
    p = dict(good["provenance"], commit="abc", dirty="no", machine={"cpu": "x"}, date="yesterday")
    del p["engine"]
    assert len(provenance_problems({**good, "provenance": p})) == 5
    carried = {**good, "provenance": dict(good["provenance"], measured_in_this_run=False), "parts": {}}
    assert provenance_problems({k: v for k, v in carried.items() if k != "parts"})[-1].startswith("not measured")
    assert parts_problems(carried, PARTED["weights.json"])  # sections present, none marked
    unnamed = {**good, "parts": {k: {"measured_in_this_run": False, "carried_from": {}} for k in "abcd"},
               "provenance": dict(good["provenance"], measured_in_this_run=False)}
    assert "part a is carried but says not from which run" in parts_problems(unnamed, PARTED["weights.json"])


def test_quick_results_dir_is_never_the_results_of_record():
    quick = results_dir(None, quick=True).resolve()
    assert quick != RESULTS.resolve() and not quick.is_relative_to(RESULTS.resolve())
    assert QUICK_OUT.resolve() == quick
    assert results_dir(None, quick=False) == RESULTS
    assert results_dir("/tmp/elsewhere", quick=True) == Path("/tmp/elsewhere")


# a write straight into bench/results: the literal path on the line of a write, a results constant
# written under, or a --out whose default is the results of record (a --quick run would land there)
DIRECT_WRITE = [
    re.compile(r"(bench/results|[\"']bench[\"']\s*/\s*[\"']results[\"']).*\.(write_text|write_bytes|savefig|open)\("),
    re.compile(r"\b(OUT|RESULTS)\s*/[^\n]*\.(write_text|write_bytes|savefig)\("),
    re.compile(r"write_results\(\s*(str\()?(OUT|RESULTS)\b"),
    re.compile(r"[\"']--out(-dir)?[\"'].*default=\s*(str\()?(OUT|RESULTS|ROOT\s*/\s*[\"']bench)"),
]


def _scripts_with_quick() -> list[Path]:
    return sorted(p for p in (ROOT / "bench").glob("*.py") if '"--quick"' in p.read_text())


def _code_lines(path: Path) -> list[tuple[int, str]]:
    """The script's lines outside docstrings."""
    tree = ast.parse(path.read_text())
    doc_lines = set()
    for node in ast.walk(tree):
        if (isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and ast.get_docstring(node)):
            d = node.body[0]
            doc_lines.update(range(d.lineno, d.end_lineno + 1))
    return [(i, ln) for i, ln in enumerate(path.read_text().splitlines(), 1) if i not in doc_lines]


@pytest.mark.parametrize("path", _scripts_with_quick(), ids=lambda p: p.name)
def test_quick_goes_through_results_dir(path):
    code = _code_lines(path)
    writes_results = any("bench/results" in ln or "write_results(" in ln or "RESULTS" in ln for _, ln in code)
    if writes_results or path.name != "ui_screenshot.py":  # ui_screenshot writes docs/img, no results
        assert any("results_dir(" in ln for _, ln in code), f"{path.name}: --quick but no results_dir()"
    hits = [f"{path.name}:{i}: {ln.strip()}" for i, ln in code for rx in DIRECT_WRITE if rx.search(ln)]
    assert hits == []


def test_direct_write_patterns_catch_the_old_ways():
    for line in ('(ROOT / "bench/results/weights_default_run.json").write_text(json.dumps(result))',
                 '    (OUT / "weights.json").write_text(json.dumps(result, indent=2))',
                 '    ap.add_argument("--out", default=str(OUT))',
                 '    print(write_results(OUT, "engine", result, markdown))'):
        assert any(rx.search(line) for rx in DIRECT_WRITE), line
    assert not any(rx.search('    out = results_dir(ns.out, ns.quick)') for rx in DIRECT_WRITE)


def test_a_copied_tree_takes_its_commit_from_the_caller(monkeypatch):
    """The device tool's copy carries an older .git: BRAID_SOURCE_COMMIT names the commit, and the
    tree counts as dirty unless BRAID_SOURCE_STATUS says it was clean (empty)."""
    from bench.report_io import provenance

    script = Path(__file__)
    # no benchmark started in this process: another test's main() leaves the commit it started on here
    monkeypatch.setattr("bench.report_io.STARTED_ON", {})
    monkeypatch.setenv("BRAID_SOURCE_COMMIT", "0123abc")
    monkeypatch.setenv("BRAID_SOURCE_STATUS", "")
    p = provenance(script, {})
    assert (p["commit"], p["dirty"]) == ("0123abc", False)
    monkeypatch.delenv("BRAID_SOURCE_STATUS")
    assert provenance(script, {})["dirty"] is True


def test_set_fleet_part_keeps_the_index(tmp_path):
    from bench.report_io import set_fleet_part

    path = tmp_path / "fleet.json"
    for key, commit in (("a", "1" * 40), ("b", "2" * 40), ("a", "3" * 40)):
        set_fleet_part(path, key, {"x": commit[0], "provenance": dict(GOOD["provenance"], commit=commit)})
    doc = json.loads(path.read_text())
    assert doc["emulated"] is True and doc["label"] == "EMULATED" and doc["a"]["x"] == "3"
    assert {k: v["carried_from"]["commit"][0] for k, v in doc["parts"].items()} == {"a": "3", "b": "2"}
    assert doc["provenance"]["commit"] == "3" * 40 and doc["provenance"]["measured_in_this_run"] is False
    assert provenance_problems(doc) == [] and parts_problems(doc, {"a": "a", "b": "b"}) == []


def test_a_fleet_subpart_has_its_own_index_entry_and_survives_its_parts_rerun(tmp_path):
    from bench.report_io import set_fleet_part, set_fleet_subpart

    path = tmp_path / "fleet.json"

    def entry(x: str, commit: str) -> dict:
        return {"x": x, "provenance": dict(GOOD["provenance"], commit=commit * 40)}

    set_fleet_part(path, "dispatch", entry("blocks", "1"))
    set_fleet_subpart(path, "dispatch", "run_signals", entry("trace", "2"))
    set_fleet_part(path, "dispatch", entry("blocks again", "3"))  # fleet_dispatch.py run again
    doc = json.loads(path.read_text())
    assert doc["dispatch"]["x"] == "blocks again" and doc["dispatch"]["run_signals"]["x"] == "trace"
    assert {k: v["carried_from"]["commit"][0] for k, v in doc["parts"].items()} == {"dispatch": "3",
                                                                                   "dispatch.run_signals": "2"}
    assert provenance_problems(doc) == []
    set_fleet_subpart(tmp_path / "new.json", "dispatch", "run_signals", entry("alone", "4"))  # no part yet
    assert json.loads((tmp_path / "new.json").read_text())["dispatch"]["run_signals"]["x"] == "alone"
