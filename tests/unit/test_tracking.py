"""flows/tracking.py: what a run hands its trackers, and how a failing tracker is kept off the run."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import pytest

from flows.tracking import RunTracking, build_trackers, flat_params, row_metrics, summary_metrics
from services.common.config import ConfigError, RunConfig


class Recorder:
    def __init__(self, name: str = "rec", fail_on: str = "", block: threading.Event | None = None) -> None:
        self.name, self.fail_on, self.block = name, fail_on, block
        self.calls: list[tuple] = []

    def _note(self, what: str, *args) -> None:
        if what == self.fail_on:
            raise ConnectionError(f"{what} refused\nsecond line")
        if self.block is not None and what == "finish":
            self.block.wait()
        self.calls.append((what, *args))

    def start(self, run_name, params):
        self._note("start", run_name, params)

    def log(self, step, metrics):
        self._note("log", step, metrics)

    def finish(self, step, summary, files, ok):
        self._note("finish", step, summary, [p.name for p in files], ok)

    def where(self):
        return {"calls": str(len(self.calls))}


def _run_dir(tmp_path: Path, rows: list[dict], summary: dict | None = None) -> Path:
    run_dir = tmp_path / "run-a"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"trainer": {"lr": 0.001, "mode": "sync"}, "tracking": ["x"]}))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if summary is not None:
        (run_dir / "summary.json").write_text(json.dumps(summary))
        (run_dir / "report.md").write_text("# report\n")
        (run_dir / "learning_curve.png").write_bytes(b"png")
    return run_dir


def test_a_row_keeps_its_names_and_numbers_and_leaves_out_the_rest():
    row = {"iteration": 3, "mode": "sync", "reward_mean": 0.5, "samples": 64, "syncs": True, "response_lens": [1, 2],
           "instances_alive": {"127.0.0.1:5000": 1, "note": "x"}, "entry_staleness_hist": {"0": 10, "1": 2}}
    assert row_metrics(row) == {"reward_mean": 0.5, "samples": 64.0, "syncs": 1.0,
                                "instances_alive/127.0.0.1_5000": 1.0,
                                "entry_staleness_hist/0": 10.0, "entry_staleness_hist/1": 2.0}
    assert summary_metrics({"mode": "sync", "final_accuracy": 0.4, "eval_final": {"accuracy": 0.4}}) == {
        "summary/final_accuracy": 0.4}


def test_the_config_becomes_dotted_params_with_lists_and_nulls_as_json():
    assert flat_params({"trainer": {"lr": 0.1, "lora": {"rank": 8}}, "tracking": ["mlflow"], "run_id": None}) == {
        "trainer.lr": 0.1, "trainer.lora.rank": 8, "tracking": '["mlflow"]', "run_id": "null"}


def test_every_row_reaches_every_tracker_then_the_summary_and_the_report(tmp_path):
    rows = [{"iteration": k, "reward_mean": k / 10} for k in range(3)]
    run_dir = _run_dir(tmp_path, rows, {"iterations": 3, "final_accuracy": 0.4, "mode": "sync"})
    a, b = Recorder("a"), Recorder("b")
    tracking = RunTracking(run_dir, [a, b], logging.getLogger("test"), interval_s=0.01)
    tracking.start()
    tracking.finish(ok=True)
    for rec in (a, b):
        assert rec.calls[0] == ("start", "run-a", {"trainer.lr": 0.001, "trainer.mode": "sync", "tracking": '["x"]'})
        assert [c[1:] for c in rec.calls if c[0] == "log"] == [(k, {"reward_mean": k / 10}) for k in range(3)]
        assert rec.calls[-1] == ("finish", 3, {"summary/iterations": 3.0, "summary/final_accuracy": 0.4},
                                 ["report.md", "learning_curve.png"], True)
    record = json.loads((run_dir / "tracking.json").read_text())
    assert record["rows_logged"] == 3 and record["failed"] == {} and record["trackers"] == ["a", "b"]


def test_a_failing_tracker_is_reported_once_and_the_others_go_on(tmp_path, caplog):
    run_dir = _run_dir(tmp_path, [{"iteration": k, "loss": 1.0} for k in range(4)], {"iterations": 4})
    broken, fine = Recorder("broken", fail_on="log"), Recorder("fine")
    tracking = RunTracking(run_dir, [broken, fine], logging.getLogger("test"), interval_s=0.01)
    with caplog.at_level(logging.WARNING):
        tracking.start()
        tracking.finish(ok=True)
    warnings = [r.getMessage() for r in caplog.records if "broken" in r.getMessage()]
    assert warnings == ["tracker broken failed (log: log refused); the run goes on without it"]
    assert [c[0] for c in broken.calls] == ["start"]  # nothing after its failure
    assert [c[0] for c in fine.calls] == ["start", "log", "log", "log", "log", "finish"]
    assert json.loads((run_dir / "tracking.json").read_text())["failed"] == {
        "broken": "log: ConnectionError: log refused\nsecond line"}


def test_a_failed_run_finishes_its_trackers_as_failed(tmp_path):
    run_dir = _run_dir(tmp_path, [{"iteration": 0, "loss": 1.0}])  # no summary.json: the run died
    rec = Recorder()
    tracking = RunTracking(run_dir, [rec], logging.getLogger("test"), interval_s=0.01)
    tracking.start()
    tracking.finish(ok=False)
    assert rec.calls[-1] == ("finish", 1, {}, [], False)


def test_rows_rolled_back_by_a_recovery_are_logged_again_when_they_run_again(tmp_path):
    run_dir = _run_dir(tmp_path, [{"iteration": k, "loss": float(k)} for k in range(3)])
    rec = Recorder()
    tracking = RunTracking(run_dir, [rec], logging.getLogger("test"))
    tracking.poll()
    (run_dir / "metrics.jsonl").write_text(json.dumps({"iteration": 0, "loss": 0.0}) + "\n")  # back to checkpoint 1
    tracking.poll()
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"iteration": 1, "loss": 1.5}) + "\n" + '{"iteration": 2, "lo')  # a row half written
    tracking.poll()
    assert [c[1:] for c in rec.calls] == [(0, {"loss": 0.0}), (1, {"loss": 1.0}),
                                          (2, {"loss": 2.0}), (1, {"loss": 1.5})]


def test_the_end_of_a_run_does_not_wait_past_the_timeout_for_a_stuck_tracker(tmp_path, caplog):
    run_dir = _run_dir(tmp_path, [], {"iterations": 0})
    release = threading.Event()
    tracking = RunTracking(run_dir, [Recorder(block=release)], logging.getLogger("test"), interval_s=0.01,
                           finish_timeout_s=0.2)
    with caplog.at_level(logging.WARNING):
        tracking.start()
        tracking.finish(ok=True)
    release.set()
    assert any("still busy after 0.2 s" in r.getMessage() for r in caplog.records)


def test_a_tracker_whose_package_is_missing_is_a_config_error(tmp_path):
    def missing(run_dir):
        raise ImportError("No module named 'mlflow'")

    with pytest.raises(ConfigError, match=r"tracking: mlflow needs the mlflow package .*braid-rl\[tracking\]"):
        build_trackers(tmp_path, ["mlflow"], {"mlflow": missing})


def test_the_config_takes_any_subset_of_the_trackers_once_each():
    assert RunConfig().tracking == []
    assert RunConfig(tracking=["wandb", "tensorboard"]).tracking == ["wandb", "tensorboard"]
    with pytest.raises(ValueError, match="tracking names mlflow more than once"):
        RunConfig(tracking=["mlflow", "tensorboard", "mlflow"])
    with pytest.raises(ValueError, match="'tensorboard', 'mlflow' or 'wandb'"):
        RunConfig(tracking=["neptune"])
