"""The headline numbers in README.md, bench/README.md and docs/ agree with the results files they quote."""

from __future__ import annotations

import json

import pytest

from bench.headlines import ROOT, check, check_all, documents, fix


@pytest.fixture
def results(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"a": {"b": 1.5, "list": [0.25], "Qwen2.5-72B": 1.23}, "n": 3}))
    return tmp_path


@pytest.mark.parametrize("text", [
    "ratio **1.50<!--@r.json a.b .2f-->x** here",
    "ratio 1.50 x<!--@r.json a.b .2f--> here",
    "share 25%<!--@r.json a.list.0 .0%-->",
    "n = 3<!--@r.json n d-->",
    "72B 1.23<!--@r.json a.Qwen2.5-72B .2f-->x",  # a key with dots in it
])
def test_a_number_that_matches_its_results_passes(text, results):
    (h,) = check(text, "t", results)
    assert h.ok, h.problem


@pytest.mark.parametrize("text, problem", [
    ("ratio 1.60<!--@r.json a.b .2f-->x", "the text says"),
    ("ratio 11.50<!--@r.json a.b .2f-->x", "the text says"),  # a longer number ending the same way
    ("ratio 1.50<!--@r.json a.c .2f-->x", "no number at a.c"),
    ("ratio 1.50<!--@gone.json a.b .2f-->x", "no results file gone.json"),
    ("ratio 1.50<!--@r.json a .2f-->x", "no number at a"),  # a dict, not a number
    ("72B 1.23<!--@r.json a.Qwen2.5-7B .2f-->x", "no number at a.Qwen2.5-7B"),
])
def test_a_number_that_disagrees_or_has_no_source_fails(text, problem, results):
    (h,) = check(text, "t", results)
    assert not h.ok and problem in h.problem


def test_every_marked_headline_agrees_with_its_results():
    headlines = check_all()
    per_doc = {doc: sum(h.where.startswith(f"{doc}:") for h in headlines) for doc in ("README.md", "bench/README.md")}
    assert per_doc["README.md"] >= 8, f"the README's benchmark table lost its markers: {per_doc}"
    assert per_doc["bench/README.md"] >= 50, f"the benchmarks' records lost their markers: {per_doc}"
    bad = [f"{h.where}: {h.problem}" for h in headlines if not h.ok]
    assert not bad, "headline numbers disagree with bench/results (re-run bench/headlines.py):\n" + "\n".join(bad)
    quoted = {h.file for h in headlines}
    assert {"pipeline.json", "e2e.json", "engine.json"} <= quoted


def test_fix_rewrites_only_the_disagreeing_numbers(results):
    text = ("ratio **1.60<!--@r.json a.b .2f-->x** [11.50<!--@r.json a.b .2f-->], n = 3<!--@r.json n d--> of 7, "
            "share 30%<!--@r.json a.list.0 .0%-->, gone 2.0<!--@gone.json a.b .2f-->")
    fixed, changes = fix(text, results)
    assert fixed == ("ratio **1.50<!--@r.json a.b .2f-->x** [1.50<!--@r.json a.b .2f-->], "
                     "n = 3<!--@r.json n d--> of 7, share 25%<!--@r.json a.list.0 .0%-->, "
                     "gone 2.0<!--@gone.json a.b .2f-->")
    assert changes == ["r.json a.b: 1.60 -> 1.50", "r.json a.b: 11.50 -> 1.50", "r.json a.list.0: 30% -> 25%"]
    assert [h for h in check(fixed, "t", results) if not h.ok and "gone" not in h.file] == []


def test_every_document_that_quotes_results_is_checked():
    checked = {str(p.relative_to(ROOT)) for p in documents()}
    assert {"README.md", "bench/README.md", "docs/staleness.md", "docs/scheduling.md"} <= checked
