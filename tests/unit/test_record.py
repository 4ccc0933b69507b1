"""Results of record pinned to their code (bench/record.py), and benchmarks refusing a dirty tree."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

import bench.record as record
import bench.report_io as report_io
from bench.record import (
    README,
    ROOT,
    check,
    code_ids,
    judge_all,
    judge_block,
    judge_file,
    measured_paths,
    stale_listed,
    unchecked_inputs,
    write_readme,
)
from bench.report_io import RESULTS, SCRATCH, RecordParser, of_record_or_scratch

SCRIPT = "bench/pipeline.py"


def _head() -> str:
    done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT, check=True)
    return done.stdout.strip()


def _fresh_block() -> dict:
    """A provenance block as a clean run at HEAD writes it."""
    script = subprocess.run(["git", "show", f"HEAD:{SCRIPT}"], capture_output=True, cwd=ROOT, check=True).stdout
    return {"commit": _head(), "dirty": False, "script": SCRIPT,
            "script_sha256": hashlib.sha256(script).hexdigest()[:16], "code": code_ids(measured_paths(SCRIPT)),
            "date": "2026-11-28T00:00:00+00:00", "measured_in_this_run": True}


def _results(tmp_path, **blocks: dict):
    results = tmp_path / "results"
    results.mkdir()
    for name, block in blocks.items():
        (results / f"{name}.json").write_text(json.dumps({"value": 1.0, "provenance": block}))
    return results


def _readme(tmp_path, *stale: str):
    rows = "".join(f"| `{n}` | why |\n" for n in stale)
    path = tmp_path / "README.md"
    table = f"| results file | why it is stale |\n|---|---|\n{rows}"
    path.write_text(f"text\n<!--stale-begin-->\n{table}<!--stale-end-->\n")
    return path


def test_a_run_measured_on_the_committed_code_is_fresh(tmp_path):
    results = _results(tmp_path, a=_fresh_block())
    assert judge_file(results / "a.json") == []
    assert check(results, _readme(tmp_path)) == []


@pytest.mark.parametrize("plant, problem", [
    ({"script_sha256": "0" * 16}, f"its script hash is not {SCRIPT}'s at commit"),
    ({"dirty": True}, "measured on a dirty tree"),
    ({"code": None, "commit": "unknown"}, "records no ids of the code it measured"),
    ({"script_sha256": None}, "records no hash of its script"),
    ({"measured_in_this_run": False}, "parts carried"),
])
def test_a_planted_mismatch_makes_the_result_stale(tmp_path, plant, problem):
    results = _results(tmp_path, a={**_fresh_block(), **plant})
    assert any(problem in p for p in judge_file(results / "a.json")), judge_file(results / "a.json")
    [bad] = check(results, _readme(tmp_path))
    assert bad.startswith("a.json is stale but README.md does not say so") and problem in bad
    assert check(results, _readme(tmp_path, "a.json")) == []  # listed as stale: the README says the truth


def test_code_changed_on_the_measured_path_makes_the_result_stale(tmp_path):
    block = _fresh_block()
    block["code"] = {**block["code"], "services": "0" * 40}  # measured another services/ than HEAD's
    results = _results(tmp_path, a=block)
    [problem] = judge_file(results / "a.json")
    assert problem.startswith("code on its measured path changed since") and problem.endswith(": services")


def _block_at(commit: str) -> dict:
    """A clean run's block at ``commit``, written before blocks recorded ``code``."""
    script = subprocess.run(["git", "show", f"{commit}:{SCRIPT}"], capture_output=True, cwd=ROOT, check=True).stdout
    return {"commit": commit, "dirty": False, "script": SCRIPT,
            "script_sha256": hashlib.sha256(script).hexdigest()[:16],
            "date": "2026-11-28T00:00:00+00:00", "measured_in_this_run": True}


def test_a_block_without_code_ids_is_judged_by_its_measured_path_at_its_commit(tmp_path):
    assert judge_file(_results(tmp_path, a=_block_at(_head())) / "a.json") == []  # nothing changed since
    touched = subprocess.run(["git", "log", "-1", "--format=%H", "--", "services"], capture_output=True, text=True,
                             cwd=ROOT, check=True).stdout.strip()
    before = tmp_path / "before"
    before.mkdir()
    [problem] = judge_file(_results(before, a=_block_at(f"{touched}~1")) / "a.json")
    assert problem.startswith("code on its measured path changed since") and "services" in problem


def test_history_kept_beside_the_results_is_not_judged(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    old = {**_fresh_block(), "dirty": True, "code": None}
    (results / "a.json").write_text(json.dumps({"provenance": _fresh_block(), "previous_regime": {"provenance": old}}))
    assert judge_file(results / "a.json") == []


def test_a_script_hash_that_no_commit_holds_is_caught_in_a_nested_block(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    nested = {**_fresh_block(), "script_sha256": "f" * 16}
    (results / "a.json").write_text(json.dumps({"provenance": _fresh_block(), "part": {"provenance": nested}}))
    assert judge_file(results / "a.json") == [f"/part: its script hash is not {SCRIPT}'s at commit {_head()[:8]}"]


def test_a_part_that_points_at_its_enclosing_run_is_judged_by_that_run(tmp_path):
    """A run that measured every regime writes each one a ``run_ref`` of itself (no script hash):
    fresh with the run; a pointer to another run (a part carried from it) is judged as it stands."""
    results = tmp_path / "results"
    results.mkdir()
    run = {**_fresh_block(), "config_hash": "c" * 16, "command": "python bench/pipeline.py"}
    own = report_io.run_ref(run)
    other = {**own, "date": "2026-11-27T00:00:00+00:00"}
    doc = {"training": {"provenance": run, "regimes": {"a": {"provenance": own}, "b": {"provenance": other}}}}
    (results / "a.json").write_text(json.dumps(doc))
    assert judge_file(results / "a.json") == ["/training/regimes/b: records no hash of its script",
                                              "/training/regimes/b: records no ids of the code it measured"]
    dirty = {**run, "dirty": True}
    doc = {"training": {"provenance": dirty, "regimes": {"a": {"provenance": report_io.run_ref(dirty)}}}}
    (results / "a.json").write_text(json.dumps(doc))
    assert judge_file(results / "a.json") == [f"/training: measured on a dirty tree ({_head()[:8]}, 2026-11-28)"]


def test_a_fresh_result_listed_as_stale_and_a_listed_file_that_is_gone_fail(tmp_path):
    results = _results(tmp_path, a=_fresh_block())
    assert check(results, _readme(tmp_path, "a.json", "gone.json")) == [
        "a.json is fresh but README.md lists it as stale", "README.md lists gone.json, which is not a results file"]


def test_write_rewrites_the_stale_table_to_what_the_results_say(tmp_path):
    results = _results(tmp_path, a=_fresh_block(), b={**_fresh_block(), "dirty": True})
    page = _readme(tmp_path, "a.json")  # says the fresh one is stale and misses the stale one
    assert len(check(results, page)) == 2
    write_readme(judge_all(results), page)
    assert check(results, page) == []
    assert list(stale_listed(page.read_text())) == ["b.json"] and page.read_text().startswith("text\n")


def test_the_benchmarks_page_says_which_results_of_record_are_stale():
    assert README == ROOT / "bench" / "README.md"
    assert check() == [], "run python bench/record.py --write"
    assert set(stale_listed(README.read_text())) <= {p.name for p in RESULTS.glob("*.json")}
    front = (ROOT / "README.md").read_text()
    assert "bench/README.md" in front, "the README links the page with the stale table"
    assert "<!--stale-begin-->" not in front, "one stale table, in bench/README.md"


def test_the_measured_path_of_a_benchmark_that_starts_the_stack_is_all_of_the_code():
    paths = measured_paths("bench/e2e.py")
    assert {"services", "flows", "requirements.lock", "bench/e2e.py", "bench/e2e_core.py"} <= set(paths)
    assert "bench/report_io.py" not in paths  # how results are written, not what they measure
    pure = measured_paths("bench/allocator.py")
    assert "allocator" in pure and "services" not in pure and "services/common/config.py" in pure


@pytest.fixture
def tree(monkeypatch):
    monkeypatch.setattr(report_io, "STARTED_ON", {})  # a parsed command line records its commit: not past this test

    def set_status(status: str) -> None:
        monkeypatch.setattr(report_io, "commit_status", lambda: ("abc", status))
    return set_status


def _parser() -> RecordParser:
    parser = RecordParser(prog="bench")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=None)
    return parser


def test_a_run_of_record_refuses_a_dirty_tree(tree, capsys):
    tree(" M services/x.py\n?? notes.txt")
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args([])
    assert exc.value.code == 2
    assert "the working tree is dirty (2 paths differ): a run of record measures a commit" in capsys.readouterr().err


def test_allow_dirty_sends_the_run_to_the_scratch_directory(tree):
    tree(" M services/x.py")
    assert _parser().parse_args(["--allow-dirty"]).out == str(SCRATCH)
    assert _parser().parse_args(["--allow-dirty", "--out", str(RESULTS)]).out == str(SCRATCH)


@pytest.mark.parametrize("args", [["--quick"], ["--out", "/tmp/elsewhere"]])
def test_scratch_runs_may_measure_a_dirty_tree(tree, args):
    tree(" M services/x.py")
    ns = _parser().parse_args(args)
    assert ns.out == (None if args == ["--quick"] else "/tmp/elsewhere")


def test_a_clean_tree_runs_of_record(tree):
    tree("")
    assert _parser().parse_args([]).out is None


def test_a_result_measured_on_a_dirty_tree_is_never_written_as_of_record(tmp_path):
    assert of_record_or_scratch(RESULTS, {"provenance": {"dirty": True}}) == SCRATCH
    assert of_record_or_scratch(RESULTS, {"provenance": {"dirty": False}}) == RESULTS
    assert of_record_or_scratch(tmp_path, {"provenance": {"dirty": True}}) == tmp_path


def test_results_other_benchmarks_wrote_do_not_make_the_tree_dirty(monkeypatch):
    monkeypatch.delenv("BRAID_SOURCE_COMMIT", raising=False)
    outputs = {("rev-parse", "HEAD"): "abc"}

    def fake_git(*args):
        return outputs.get(args, status)

    monkeypatch.setattr(report_io, "git", fake_git)
    status = "M bench/results/chaos.json\n M bench/results/chaos.md\n?? bench/results/runs.json"  # git() strips
    assert report_io.commit_status() == ("abc", "")
    status = "M bench/results/chaos.json\n M services/rollout/publisher.py"
    assert report_io.commit_status() == ("abc", " M services/rollout/publisher.py")


def test_a_commit_made_during_a_run_makes_its_result_dirty(monkeypatch, tmp_path):
    """The run started on one commit and HEAD moved before it wrote its result: its later processes may
    have imported the new code, so it is measured on neither commit (dirty: scratch, never of record)."""
    monkeypatch.setattr(report_io, "STARTED_ON", {})
    head = {"commit": "abc"}
    monkeypatch.setattr(report_io, "commit_status", lambda: (head["commit"], ""))
    _parser().parse_args([])
    script = ROOT / "bench" / "record.py"
    assert report_io.provenance(script, {})["dirty"] is False
    head["commit"] = "def"  # committed while the benchmark ran
    prov = report_io.provenance(script, {})
    assert prov["dirty"] is True and prov["commit"] == "abc" and prov["commit_at_end"] == "def"
    assert of_record_or_scratch(RESULTS, {"provenance": prov}) == SCRATCH


def test_what_a_benchmark_runs_without_importing_it_is_on_its_measured_path():
    """The test chaos runs, TRL's side of the peer benchmarks, the examples a benchmark loads by name
    and both lock files: a change to any of them stales the results that ran them."""
    from bench.record import ALWAYS, RUNS

    assert "tests/integration/test_bounded.py" in measured_paths("bench/chaos.py")
    assert {"bench/trl_peer.py", "bench/trl_fair_peer.py"} <= set(measured_paths("bench/trl_fair.py"))
    assert "examples" in measured_paths("bench/gateway.py")
    assert "requirements-models.lock" in ALWAYS and "requirements-models.lock" in measured_paths("bench/allocator.py")
    for script, paths in RUNS.items():
        assert (ROOT / script).is_file(), script
        assert all((ROOT / p).exists() for p in paths), paths


def test_what_a_benchmark_reads_or_names_by_string_is_on_its_measured_path():
    """The stack's packages include the examples a config loads by name; the closure follows a test's
    own imports, the data files a script names by path, and never a benchmark's outputs."""
    assert "examples" in record.STACK and "examples" in measured_paths("bench/e2e.py")
    assert {"tests/integration/runs.py", "tests/conftest.py"} <= set(measured_paths("bench/chaos.py"))
    assert "bench/profiles/vllm-cpu-dispatch-train.json" in measured_paths("bench/dispatch_train_sim.py")
    assert "tests/fixtures/ranker_small.jsonl" in measured_paths("bench/fuzz.py")
    assert "bench/trl_fair.py" not in measured_paths("bench/e2e.py")  # a label ("source"), not a run
    for script in sorted(str(p.relative_to(ROOT)) for p in (ROOT / "bench").glob("*.py")):
        assert not [p for p in measured_paths(script) if p.startswith(record.OUTPUTS)], script


DEMO = """import subprocess
import sys
from pathlib import Path

import helper

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "bench/profiles/p.json"  # a data file it reads
OUT = ROOT / "bench/results/out.jsonl"  # what it writes: not on its path
AGENT = "examples.agent:play"  # loaded by name through a registry


def main():
    subprocess.run([sys.executable, "-m", "services.generation"], check=True)
    subprocess.run([sys.executable, str(ROOT / "bench" / "peer.py")], check=True)
"""
FILES = {"bench/__init__.py": "", "bench/demo.py": DEMO, "bench/helper.py": "X = 1\n", "bench/peer.py": "Y = 1\n",
         "bench/profiles/p.json": "{}\n", "bench/results/out.jsonl": "{}\n", "bench/README.md": "",
         "services/__init__.py": "", "services/generation/__init__.py": "", "services/generation/__main__.py": "\n",
         "examples/agent.py": "def play(e):\n    return 1.0\n", "requirements.lock": "a==1\n",
         "requirements-models.lock": "m==1\n", "pyproject.toml": "[project]\n"}


class Planted:
    """A git repository beside a ``shared/data`` directory, with record.py and report_io looking at it."""

    def __init__(self, base: Path) -> None:
        self.root, self.shared = base / "repo", base / "shared" / "data"
        self.shared.mkdir(parents=True)
        for rel, text in FILES.items():
            (self.root / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.root / rel).write_text(text)
        self.git("init", "-q")
        self.commit("the measured code")

    def git(self, *args: str) -> str:
        done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=self.root,
                              capture_output=True, text=True, check=True)
        return done.stdout.strip()

    def commit(self, message: str) -> None:
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message)

    def change(self, rel: str) -> None:
        path = self.root / rel if not rel.startswith("../") else self.root.parent / rel[3:]
        path.write_text(path.read_text() + "# changed\n")  # another size: never the same file to a cache


@pytest.fixture
def planted(tmp_path, monkeypatch):
    repo = Planted(tmp_path.resolve())
    for module in (record, report_io):
        monkeypatch.setattr(module, "ROOT", repo.root)
    monkeypatch.setattr(record, "RESULTS", repo.root / "bench" / "results")
    monkeypatch.setattr(record, "README", repo.root / "bench" / "README.md")
    monkeypatch.setattr(record, "PURE", {"bench/demo.py": ()})  # nothing whole: the closure must find each file
    monkeypatch.setattr(record, "RUNS", {"bench/demo.py": ("bench/peer.py",)})
    monkeypatch.setattr(report_io, "STARTED_ON", {})
    monkeypatch.delenv("BRAID_SOURCE_COMMIT", raising=False)
    measured_paths.cache_clear()
    yield repo
    measured_paths.cache_clear()


def _planted_block(repo: Planted, inputs: list[Path] | None = None) -> dict:
    return report_io.provenance(repo.root / "bench" / "demo.py", {}, inputs=inputs)


@pytest.mark.parametrize("rel", [
    "requirements-models.lock", "requirements.lock",  # the locked packages
    "examples/agent.py",  # named by a registry string
    "services/generation/__main__.py",  # started with python -m
    "bench/peer.py",  # a peer script it runs without importing (RUNS)
    "bench/helper.py",  # a sibling it imports
    "bench/profiles/p.json",  # a data file it reads by path
])
def test_a_planted_change_on_the_measured_path_stales_the_result(planted, rel):
    block = _planted_block(planted)
    assert rel in block["code"] and judge_block(block) == []
    planted.change(rel)
    planted.commit(f"change {rel}")
    [problem] = judge_block(block)
    assert problem.startswith("code on its measured path changed since") and problem.endswith(f": {rel}")


def test_a_change_to_what_a_benchmark_writes_does_not_stale_it(planted):
    block = _planted_block(planted)
    assert "bench/results/out.jsonl" not in block["code"]
    planted.change("bench/results/out.jsonl")
    planted.commit("a re-run's results")
    assert judge_block(block) == []


def test_the_examples_are_part_of_the_stack_a_process_starting_benchmark_runs(planted, monkeypatch):
    monkeypatch.setattr(record, "PURE", {})
    block = _planted_block(planted)
    assert block["code"]["examples"] is not None and "examples/agent.py" not in block["code"]
    planted.change("examples/agent.py")
    planted.commit("another agent")
    assert judge_block(block)[0].endswith(": examples")


def test_a_planted_change_in_an_input_outside_the_repository_stales_the_result(planted):
    data = planted.shared / "lengths.jsonl"
    data.write_text('{"n": 1}\n')
    block = _planted_block(planted, inputs=[data])
    assert list(block["inputs"]) == ["../shared/data/lengths.jsonl"] and judge_block(block) == []
    planted.change("../shared/data/lengths.jsonl")
    assert judge_block(block) == ["input ../shared/data/lengths.jsonl changed since the run"]


def test_an_input_absent_on_this_machine_is_not_stale_but_said_unchecked(planted, capsys):
    data = planted.shared / "lengths.jsonl"
    data.write_text('{"n": 1}\n')
    estimates = planted.root / "bench" / "results" / "out.jsonl"  # a results file read as input
    block = _planted_block(planted, inputs=[data, estimates])
    assert set(block["inputs"]) == {"../shared/data/lengths.jsonl", "bench/results/out.jsonl"}
    data.unlink()  # CI has no ../shared
    assert judge_block(block) == []
    (planted.root / "bench" / "results" / "a.json").write_text(json.dumps({"provenance": block}))
    assert unchecked_inputs({"provenance": block}) == ["../shared/data/lengths.jsonl"]
    (planted.root / "bench" / "README.md").write_text("<!--stale-begin-->\n<!--stale-end-->\n")
    assert record.main(["--write"]) == 0  # the planted repository's page, its one result fresh
    assert "could not check its inputs (not on this machine): ../shared/data/lengths.jsonl" in capsys.readouterr().out
    planted.change("bench/results/out.jsonl")
    assert judge_block(block) == ["input bench/results/out.jsonl changed since the run"]


def test_a_result_whose_head_moved_during_the_run_is_stale(planted):
    _parser().parse_args([])  # the run starts: STARTED_ON
    started = planted.git("rev-parse", "HEAD")
    planted.change("bench/helper.py")
    planted.commit("committed while the benchmark ran")
    block = _planted_block(planted)
    ended = planted.git("rev-parse", "HEAD")
    assert block["commit"] == started and block["commit_at_end"] == ended
    assert judge_block(block)[0] == f"HEAD moved during the run: started on {started[:8]}, ended on {ended[:8]}"
