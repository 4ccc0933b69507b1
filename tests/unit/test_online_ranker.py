"""The online ranker retrainer's pure parts and its thread: when a retrain is due, what it is
asked, what it records (a failure included), and the report's section."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from flows.online_ranker import OnlineRetrainer, next_due, read_retrains, report_lines, retrain_params, swaps
from services.common.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]


def _cfg(tmp_path: Path, *extra: str):
    return load_config(ROOT / "deploy/configs/smoke.yaml", [
        f"generation.genlog={tmp_path / 'gen.sqlite'}", f"generation.ranker_dir={tmp_path / 'store'}",
        "generation.retrain.every=3", *extra])


def test_due_every_n_iterations_skipping_those_missed():
    assert [next_due(d, 3) for d in (0, 2, 3, 5, 7)] == [3, 3, 6, 6, 9]


def test_params_default_a_causal_lm_to_the_policy_checkpoint(tmp_path):
    p = retrain_params(_cfg(tmp_path, "generation.retrain.kind=causal_lm"), tmp_path, "/ck", 6)
    assert p["model_params"] == {"base_path": "/ck"} and p["kind"] == "causal_lm"
    assert p["log_path"].endswith("gen.sqlite") and p["work_dir"].endswith("ranker-retrains/it000006")
    mine = retrain_params(_cfg(tmp_path, "generation.retrain.kind=causal_lm",
                               'generation.retrain.params={"base_path": "/x"}'),
                          tmp_path, "/ck", 6)
    assert mine["model_params"] == {"base_path": "/x"}
    assert retrain_params(_cfg(tmp_path), tmp_path, "/ck", 3)["model_params"] == {}


def test_retrain_needs_a_log_and_a_store_and_a_known_kind(tmp_path):
    from flows.registries import check_registries

    with pytest.raises(ConfigError, match=r"needs generation\.genlog"):
        load_config(ROOT / "deploy/configs/smoke.yaml", ["generation.retrain.every=2"])
    with pytest.raises(ConfigError, match=r"generation\.retrain\.kind 'nope' is not one of"):
        check_registries(_cfg(tmp_path, "generation.retrain.kind=nope"))


def test_one_retrain_at_a_time_rows_record_results_and_failures(tmp_path):
    gate, calls = threading.Event(), []

    def fake(params):
        calls.append(params)
        gate.wait(10)
        if len(calls) == 2:
            raise ValueError("generation log has 12 finished samples, retraining needs at least min_samples=200")
        return {"published": "r-2", "previous": "r-1", "n_train": 90, "n_holdout": 10,
                "before": {"recall_at_20": 0.5}, "after": {"recall_at_20": 0.75}}

    retrainer = OnlineRetrainer(tmp_path, _cfg(tmp_path), "/ck", retrain=fake)
    retrainer(2)  # not due
    retrainer(3)
    retrainer(4)  # due at 6 now, and one is running
    retrainer(7)  # due, but one is still running: skipped, not queued
    gate.set()
    retrainer.close(10)
    retrainer(7)
    retrainer.close(10)
    assert [c.kind for c in calls] == ["lightgbm", "lightgbm"] and len(calls) == 2
    rows = read_retrains(tmp_path)
    assert rows[0]["iteration"] == 3 and rows[0]["published"] == "r-2" and rows[0]["recall_after"] == 0.75
    assert rows[1]["iteration"] == 7 and "min_samples=200" in rows[1]["error"]
    end = rows[0]["published_at"] + 2.5
    metrics = [{"iteration": 3, "ranker_version": "r-1"}, {"iteration": 4, "ranker_version": "r-2", "t_end": end}]
    assert swaps(rows, metrics) == [(4, 2.5), None]
    text = "\n".join(report_lines(tmp_path, metrics))
    assert "| 3 | 90 / 10 | 0.500 → 0.750 | r-2 |" in text and "| 4 (2.5 s) |" in text
    assert "not retrained: ValueError" in text
    assert report_lines(tmp_path / "nothing", metrics) == []
    json.dumps(rows)  # rows are JSON


def test_the_retrain_deployment_defaults_are_what_a_skewness_run_writes(tmp_path, monkeypatch):
    from prefect.utilities.callables import parameter_schema

    from flows.retrain_ranker import RetrainParams, read_log, retrain_ranker
    from ranker.genlog import GenerationLog, GenRecord

    skew = load_config(ROOT / "deploy/configs/skewness.yaml").generation
    params = RetrainParams()
    assert (params.log_path, params.store_root) == (skew.genlog, skew.ranker_dir)
    assert not parameter_schema(retrain_ranker.fn).required  # the deployment runs with no parameters
    monkeypatch.chdir(tmp_path)  # where the run's relative paths resolve, as the repository root does
    with pytest.raises(ValueError, match=r"runs/generation-log.sqlite: no such generation log .*skewness.yaml"):
        read_log.fn(params.log_path, params.n_recent, params.holdout_fraction, 10, str(tmp_path / "work"))
    Path(skew.genlog).parent.mkdir(parents=True)
    with GenerationLog(skew.genlog) as log:
        log.append(GenRecord(f"p{i}", f"prompt {i}", 5 + i, 1, 0, float(i)) for i in range(40))
    split = read_log.fn(params.log_path, params.n_recent, params.holdout_fraction, 10, str(tmp_path / "work"))
    assert split["n_train"] + split["n_holdout"] == 40 and Path(split["holdout"] + ".unit").read_text() == "tokens\n"
