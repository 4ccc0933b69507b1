"""Results of record pinned to the code they measured and the files they read.

Every provenance block a benchmark writes (``bench/report_io.provenance``) names its script and
records ``code``: the git object id, at the measured commit, of each path on the script's measured
path (``measured_paths``), and ``inputs``: the sha256 of each file it read from outside the
repository's tracked code (``--data ../shared/data/...``, a results file read as input). A script's
measured path is:

- its **import closure** (static), started from the script and the Python files it runs without
  importing them (``RUNS``: peer scripts, the test chaos runs). Besides ``import`` statements, a
  string literal in any file of the closure counts as an import of what it names when it is exactly
  a repository module's dotted name, optionally ``module:attr`` (``"services.generation"`` in a
  ``python -m`` argv, with its ``__main__.py``; ``"examples.calculator_agent:play"`` for a registry),
  or the repository path of a data file (not ``.py``, not under ``bench/results/``: results a
  benchmark reads go to ``inputs``), e.g. ``ROOT / "bench/profiles/x.json"``;
- the lock files and ``pyproject.toml`` (``ALWAYS``: the locked packages);
- what it runs without importing (``RUNS``);
- for a benchmark that starts Braid's processes, **all** of ``STACK``: every package a config value,
  a ``--set`` override or a registry may name by string (``python:examples...``, ``agentic.agent``,
  ``python -m services...``); a benchmark that starts none (``PURE``) names its own directories.

A result is **fresh** when its tree was clean and HEAD did not move during its run, its script's
recorded hash is the script's at its commit, every path on its measured path still has the recorded
id at HEAD (a block written before ``code`` existed: the ids of its script's measured path at its
commit, read from git), and every recorded input that exists here still has its recorded hash (an
input absent on this machine, e.g. ``../shared`` in CI, cannot be checked: not stale, and
``python bench/record.py`` says so). Anything else is **stale**, and bench/README.md (the benchmarks'
page, linked from the README) must say so: its stale table (between ``<!--stale-begin-->`` and
``<!--stale-end-->``) lists exactly the results files that are not fresh, each with the reasons.
``tests/unit/test_record.py`` holds that page to it, and fails on a planted mismatch.

    python bench/record.py            # every results file: fresh, or why not
    python bench/record.py --write    # rewrite bench/README.md's stale table from the results
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
README = ROOT / "bench" / "README.md"  # the page with the stale table
# what any benchmark's outcome depends on besides its own imports: the locked packages
ALWAYS = ("requirements.lock", "requirements-models.lock", "pyproject.toml")
# benchmarks that start Braid's services or flows as processes run code they never import: all of it, and
# the user code a config or registry loads by name (``examples``)
STACK = ("services", "flows", "allocator", "ranker", "deploy", "examples")
# benchmarks that start no process (simulators, fits over recorded data): their imports and the data they read
PURE = {"bench/allocator.py": ("allocator", "deploy/clusters", "deploy/workloads"),
        "bench/coordination_sim.py": ("allocator", "bench/profiles"),
        "bench/ranker.py": ("ranker",)}
# what a benchmark runs without importing it (scripts it starts, tests it runs): their imports are followed too
RUNS = {"bench/chaos.py": ("tests/integration/test_bounded.py",),
        "bench/e2e.py": ("bench/trl_peer.py",),
        "bench/trl_fair.py": ("bench/trl_peer.py", "bench/trl_fair_peer.py")}
PACKAGES = ("bench", "services", "flows", "allocator", "ranker", "examples", "tests")
# a string literal naming a repository module (``services.generation``, ``examples.agent:play``)
_MODULE_NAME = re.compile(r"(?P<name>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?::[A-Za-z_][\w.]*)?")
# outputs of benchmarks: one read as input is recorded by its hash (``inputs``), never by a path literal
OUTPUTS = "bench/results/"
# how results are written and judged, not what they measure
NOT_MEASURED = ("bench/report_io.py", "bench/record.py", "bench/headlines.py")
# what a part's pointer to the run that measured it keeps of that run (``bench.report_io.run_ref``)
RUN_REF = ("commit", "dirty", "date", "config_hash", "command")
# an earlier regime's verdicts kept beside the new ones (DESIGN.md §5: a changed definition keeps
# the old metric beside the new): history with its own provenance, not a result of record
HISTORY = ("previous_regime",)
_STALE = re.compile(r"<!--stale-begin-->\n(?P<table>.*?)<!--stale-end-->", re.S)


def git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT)
    except FileNotFoundError:  # no git on the machine (the lent GPU machine)
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _module_file(name: str, beside: Path) -> str | None:
    """The repository file of module ``name`` imported from a file in ``beside`` (a script's siblings
    import each other by bare name: its directory is first on ``sys.path``)."""
    if name.split(".")[0] not in PACKAGES:
        sibling = beside / f"{name}.py"
        return str(sibling.relative_to(ROOT)) if "." not in name and sibling.is_file() else None
    base = ROOT / Path(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return str(path.relative_to(ROOT))
    return None


def _imported(node: ast.AST) -> list[str]:
    """The module names an ``import`` statement names (relative imports: none)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        return [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return []


def named_by_literal(text: str) -> list[str]:
    """The repository files a string literal names (the module docstring's rule): a module's file by its
    dotted name (a package's ``__main__.py`` too: ``python -m``), or a data file by its path."""
    if len(text) > 200 or any(c.isspace() for c in text):
        return []
    m = _MODULE_NAME.fullmatch(text)
    if m and m.group("name").split(".")[0] in PACKAGES:
        base = ROOT / Path(*m.group("name").split("."))
        found = [base.with_suffix(".py"), base / "__init__.py", base / "__main__.py"]
        return [str(f.relative_to(ROOT)) for f in found if f.is_file()]
    rel, _, node = text.partition("::")  # a test's node id: the test file it runs
    runs = rel.endswith(".py") == bool(node)  # a bare .py path is a label (``"source": "bench/x.py"``), not a run
    if "/" in rel and runs and not rel.startswith(("/", ".", OUTPUTS)) and (ROOT / rel).is_file():
        return [rel]
    return []


@functools.cache  # each file parsed once, however many scripts' closures hold it
def _named_in(path: Path, mtime_ns: int) -> tuple[str, ...]:
    """The repository files the Python file at ``path`` imports or names by a string literal."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        found += [f for n in _imported(node) if (f := _module_file(n, path.parent))]
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += named_by_literal(node.value)
    return tuple(dict.fromkeys(found))


def import_closure(script: str, runs: tuple[str, ...] = ()) -> set[str]:
    """The repository files ``script`` (and the Python files in ``runs``) import, directly or through
    each other (static), with what their string literals name (``named_by_literal``)."""
    seen: set[str] = set()
    todo = [script, *(r for r in runs if r.endswith(".py"))]
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        seen.add(rel)
        if rel.endswith(".py"):  # a data file a literal names: on the path, nothing to follow
            todo += [f for f in _named_in(ROOT / rel, (ROOT / rel).stat().st_mtime_ns) if f not in seen]
    return seen


@functools.cache  # judged once per script, not once per provenance block (callers never mutate it)
def measured_paths(script: str) -> list[str]:
    """What ``script``'s results depend on, as repository paths (files and directories)."""
    runs = RUNS.get(script, ())
    paths = (import_closure(script, runs) - set(NOT_MEASURED)) | set(ALWAYS) | set(runs)
    whole = PURE.get(script, STACK)
    return sorted({p for p in paths if not p.startswith(tuple(f"{d}/" for d in whole))} | set(whole))


def code_ids(paths: list[str], rev: str = "HEAD") -> dict[str, str | None]:
    """The git object id of each path at ``rev`` (None: not there)."""
    listed = (git("ls-tree", "--full-tree", rev, "--", *paths) or "") if paths else ""
    ids = {path: meta.split()[2] for meta, path in (line.split("\t", 1) for line in listed.splitlines())}
    return {p: ids.get(p) for p in paths}


def input_key(path: str | Path) -> str:
    """How a block names an input file: its path relative to the repository when it lies in or beside
    it (``../shared/data/x.jsonl.gz``, ``bench/results/x.jsonl``: the same on every checkout), else absolute."""
    path = Path(os.path.abspath(path))  # as given: a symlinked data directory keeps its name
    return os.path.relpath(path, ROOT) if path.is_relative_to(ROOT.parent) else str(path)


@functools.cache
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def file_sha256(path: Path) -> str:
    """The first 16 hex digits of a file's sha256 (read once per size and modification time)."""
    st = path.stat()
    return _sha256(str(path), st.st_size, st.st_mtime_ns)


def input_hashes(paths: list[Path]) -> dict[str, str | None]:
    """What a provenance block records of the files a run read (None: not a file when it was recorded)."""
    return {input_key(p): file_sha256(Path(p)) if Path(p).is_file() else None for p in paths}


def _input_path(key: str) -> Path:
    return Path(key) if Path(key).is_absolute() else ROOT / key


def input_problems(block: dict) -> list[str]:
    """The recorded inputs that are here and differ from what the run read (one absent here is not checked)."""
    inputs = block.get("inputs")
    if not isinstance(inputs, dict):
        return []
    return [f"input {key} changed since the run" for key, digest in sorted(inputs.items())
            if digest is not None and _input_path(key).is_file() and file_sha256(_input_path(key)) != digest]


def unchecked_inputs(doc: object) -> list[str]:
    """The recorded inputs of a results document that cannot be checked on this machine (absent here)."""
    return sorted({key for _, block in blocks(doc) for key, digest in (block.get("inputs") or {}).items()
                   if digest is None or not _input_path(key).is_file()})


def script_of(block: dict) -> str | None:
    """The benchmark script a provenance block names (older blocks: read from its command line)."""
    if block.get("script"):
        return block["script"]
    words = str(block.get("command", "")).split()
    for w in words[1:]:
        m = re.search(r"(bench/[\w]+\.py)$", w)
        if m:
            return m.group(1)
        if w.startswith("bench."):
            return w.replace(".", "/") + ".py"
    return None


def blocks(doc: object, where: str = "") -> list[tuple[str, dict]]:
    """Every provenance block in a results document, with its key path (``.`` for the top one);
    history kept beside the results (``HISTORY``) is not judged."""
    found = []
    if isinstance(doc, dict):
        if isinstance(doc.get("provenance"), dict):
            found.append((where or ".", doc["provenance"]))
        for key, value in doc.items():
            if key != "provenance" and key not in HISTORY:
                found += blocks(value, f"{where}/{key}")
    return found


def judge_block(block: dict) -> list[str]:
    """Why one provenance block's result is not fresh (empty: it is)."""
    problems = []
    commit = str(block.get("commit", "unknown"))
    end = block.get("commit_at_end")
    if end and end != commit:  # ``provenance`` marks such a run dirty too: this says why
        problems.append(f"HEAD moved during the run: started on {commit[:8]}, ended on {str(end)[:8]}")
    elif block.get("dirty") is not False:
        problems.append(f"measured on a dirty tree ({commit[:8]}, {block.get('date', '?')[:10]})")
    script = script_of(block)
    if not block.get("script_sha256"):
        problems.append("records no hash of its script")
    elif script and commit != "unknown" and git("cat-file", "-e", f"{commit}^{{commit}}") is not None:
        at_commit = subprocess.run(["git", "show", f"{commit}:{script}"], capture_output=True, cwd=ROOT).stdout
        if not at_commit:
            problems.append(f"{script} is not in commit {commit[:8]}")
        elif hashlib.sha256(at_commit).hexdigest()[:16] != block.get("script_sha256"):
            problems.append(f"its script hash is not {script}'s at commit {commit[:8]}")
    code = block.get("code")
    if (not isinstance(code, dict) or not code) and not problems and script and (ROOT / script).is_file():
        code = code_ids(measured_paths(script), commit)  # an older block: its measured path at its commit
        code = code if any(code.values()) else None
    if not isinstance(code, dict) or not code:
        problems.append("records no ids of the code it measured")
    else:
        now = code_ids(sorted(code))
        changed = [p for p in sorted(code) if now[p] != code[p]]
        if changed:
            problems.append(f"code on its measured path changed since {commit[:8]}: {', '.join(changed[:6])}"
                            + (f" (+{len(changed) - 6} more)" if len(changed) > 6 else ""))
    return problems + input_problems(block)


def judge_file(path: Path) -> list[str]:
    doc = json.loads(path.read_text())
    found = blocks(doc)
    if not found:
        return ["no provenance"]
    problems = []
    top = doc.get("provenance") if isinstance(doc, dict) else None
    if isinstance(top, dict) and top.get("measured_in_this_run") is False:
        problems.append("not all of it was measured in its latest run (parts carried)")
    by_where = dict(found)
    for where, block in found:
        if refers_to_enclosing_run(where, block, by_where):
            continue  # judged as that run's own block
        problems += [p if where == "." else f"{where}: {p}" for p in judge_block(block)]
    return problems


def refers_to_enclosing_run(where: str, block: dict, by_where: dict[str, dict]) -> bool:
    """Whether ``block`` is only a reference (``run_ref``: no script hash) to the run whose full
    provenance block encloses it (e.g. each regime of a run that measured them all): then that
    block says everything there is to judge. A reference to any other run is judged as it stands."""
    if block.get("script_sha256") or not set(block) <= set(RUN_REF):
        return False
    parts = where.split("/")
    for cut in range(len(parts) - 1, 0, -1):
        parent = by_where.get("/".join(parts[:cut]) or ".")
        if parent is not None:
            return parent.get("script_sha256") is not None and all(parent.get(k) == block.get(k) for k in RUN_REF)
    return False


def stale_listed(readme: str) -> dict[str, str]:
    """A page's stale table: results file -> the reasons it gives."""
    m = _STALE.search(readme)
    if m is None:
        return {}
    rows = re.findall(r"^\| `([\w.-]+\.json)` \| (.*) \|$", m.group("table"), re.M)
    return dict(rows)


def judge_all(results: Path = RESULTS) -> dict[str, list[str]]:
    """Every results file's problems (empty: fresh), by file name."""
    return {path.name: judge_file(path) for path in sorted(results.glob("*.json"))}


def check(results: Path = RESULTS, readme: Path = README, judged: dict[str, list[str]] | None = None) -> list[str]:
    """Every disagreement between the results' freshness and the stale table of ``readme``."""
    listed = stale_listed(readme.read_text())
    page = str(readme.relative_to(ROOT)) if readme.is_relative_to(ROOT) else readme.name
    bad = []
    for name, problems in (judged if judged is not None else judge_all(results)).items():
        if problems and name not in listed:
            bad.append(f"{name} is stale but {page} does not say so: {'; '.join(problems)}")
        elif not problems and name in listed:
            bad.append(f"{name} is fresh but {page} lists it as stale")
    bad += [f"{page} lists {name}, which is not a results file" for name in listed
            if not (results / name).is_file()]
    return bad


def stale_table(judged: dict[str, list[str]]) -> str:
    lines = ["| results file | why it is stale |", "|---|---|"]
    lines += [f"| `{name}` | {'; '.join(problems).replace('|', '/')} |"
              for name, problems in judged.items() if problems]
    return "\n".join(lines) + "\n"


def write_readme(judged: dict[str, list[str]], readme: Path = README) -> None:
    text = readme.read_text()
    if not _STALE.search(text):
        raise SystemExit(f"{readme} has no <!--stale-begin--> ... <!--stale-end--> section")
    readme.write_text(_STALE.sub(lambda _: f"<!--stale-begin-->\n{stale_table(judged)}<!--stale-end-->", text))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["--write"]):
        print(__doc__)
        return 2
    judged = judge_all(RESULTS)  # each file judged once (git calls per provenance block)
    if args == ["--write"]:
        write_readme(judged, README)
    for name, problems in judged.items():
        print(f"{name:28s} {'fresh' if not problems else 'STALE: ' + '; '.join(problems)}")
        if absent := unchecked_inputs(json.loads((RESULTS / name).read_text())):
            print(f"{'':28s} could not check its inputs (not on this machine): {', '.join(absent)}")
    bad = check(RESULTS, README, judged=judged)
    print("\n".join(bad) if bad else f"{README.relative_to(ROOT)}'s stale table agrees with the results")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
