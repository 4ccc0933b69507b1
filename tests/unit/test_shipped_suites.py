"""The evaluation suites deploy/configs/smollm2-arith.yaml ships: their files pass the checks a run makes,
are what their committed recipes write, and never ask a question the run trains on."""

from __future__ import annotations

import gzip
import importlib.util
import json
import random
from pathlib import Path

import pytest

from flows.registries import check_run
from services.common.config import load_config
from tests.conftest import ROOT

DATA = ROOT / "deploy" / "data"
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k" / "test.jsonl.gz"


def _recipe(name: str):
    spec = importlib.util.spec_from_file_location(f"make_{name.replace('-', '_')}", DATA / name / "make.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_the_shipped_suites_load_as_a_run_loads_them(monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = check_run(load_config(ROOT / "deploy/configs/smollm2-arith.yaml"))
    names = [s.name for s in cfg.eval.suites]
    assert names == ["word-mul", "word-add", "gsm8k-easy"] and all(Path(s.data).is_absolute() for s in cfg.eval.suites)
    assert all(s.temperature == 0 and s.prompts == 100 for s in cfg.eval.suites)


def test_the_probe_files_are_their_recipes_output_and_outside_the_training_questions():
    make = _recipe("arith-probe")
    trained = make.training_questions()
    for i, family in enumerate(make.FAMILIES):
        rows = _rows(DATA / "arith-probe" / f"{family}.jsonl")
        assert rows == make.draw(family, random.Random(20261130 + i), trained)
        assert len({r["question"] for r in rows}) == make.ROWS and not {r["question"] for r in rows} & trained


@pytest.mark.skipif(not GSM8K.is_file(), reason="../shared/data/gsm8k is not beside this checkout")
def test_gsm8k_easy_is_its_recipes_output_from_the_test_split():
    make = _recipe("gsm8k-easy")
    with gzip.open(GSM8K, "rt", encoding="utf-8") as f:
        lines = [x for x in f.read().splitlines() if x.strip()]
    rows = _rows(DATA / "gsm8k-easy" / "test.jsonl")
    assert rows == make.easiest(lines) and len(rows) == 326
    source = json.loads(lines[rows[5]["gsm8k_test_line"] - 1])
    assert source["question"] == rows[5]["question"] and source["answer"].endswith(f"#### {rows[5]['answer']}")


def test_gsm8k_easy_carries_its_provenance_and_licence():
    source = (DATA / "gsm8k-easy" / "SOURCE.md").read_text()
    assert "3101c7d5072418e28b9008a6636bde82a006892c" in source and "MIT" in source
    assert "Copyright (c) 2021 OpenAI" in (DATA / "gsm8k-easy" / "LICENSE").read_text()
    assert all(isinstance(r["answer"], int) and r["steps"] == 2 for r in _rows(DATA / "gsm8k-easy" / "test.jsonl"))
