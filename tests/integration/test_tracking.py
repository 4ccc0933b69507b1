"""Experiment trackers for real: a flow run logging to TensorBoard and to an MLflow tracking server
this module starts, W&B in offline mode, and an MLflow server that dies in the middle of a run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from flows.processes import free_port

# `make test-long` (CI runs it): too long for the 15-minute fast tier (docs/testing.md)
pytestmark = pytest.mark.long

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "deploy/configs/smoke.yaml")


class MlflowServer:
    """``mlflow server`` on a free loopback port: SQLite store, artifacts served by the server."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = root / "server.log"
        cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", self.url.rsplit(":", 1)[1],
               "--workers", "1", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
               "--artifacts-destination", str(root / "artifacts")]
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(cmd, cwd=root, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout_s: float = 180.0) -> MlflowServer:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"mlflow server did not come up:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.3)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the server and its uvicorn worker
            self.proc.wait(30)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Two servers booting side by side (and beside the Prefect API): one for the run of record, one the
    last test kills. ``tracked_run`` waits for them."""
    root = tmp_path_factory.mktemp("mlflow")
    both = [MlflowServer(root / "kept"), MlflowServer(root / "doomed")]
    yield both
    for s in both:
        s.stop()


@pytest.fixture(scope="module")
def tracked_run(servers, prefect_api, tmp_path_factory):
    """A two-iteration smoke flow run with ``tracking: [tensorboard, mlflow]`` against the kept server."""
    from flows.rl_training import rl_training

    tmp = tmp_path_factory.mktemp("tracked")
    for server in servers:
        server.wait_ready()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", servers[0].url)
        mp.setenv("MLFLOW_EXPERIMENT_NAME", "braid-test")
        result = rl_training(config_path=SMOKE, overrides=[
            f"runs_dir={tmp / 'runs'}", f"cache_dir={tmp / 'cache'}", "run_id=tracked",
            "tracking=[tensorboard,mlflow]"])
    return Path(result["run_dir"])


def _numbers(path: Path) -> dict[str, float]:
    return {k: v for k, v in json.loads(path.read_text()).items() if isinstance(v, (int, float))}


def test_a_run_leaves_a_tensorboard_event_file_with_its_metrics_and_summary(tracked_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rows = [json.loads(x) for x in (tracked_run / "metrics.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(tracked_run / "tensorboard"))
    events.Reload()
    for key in ("reward_mean", "loss", "staleness_mean", "samples_per_s"):
        assert [(e.step, pytest.approx(e.value, rel=1e-6)) for e in events.Scalars(key)] == [
            (r["iteration"], r[key]) for r in rows], key
    summary = _numbers(tracked_run / "summary.json")
    for key in ("final_accuracy", "warmstart_accuracy", "accuracy_stderr", "improvement"):
        [event] = events.Scalars(f"summary/{key}")
        assert (event.step, event.value) == (2, pytest.approx(summary[key], rel=1e-6)), key
    assert {"report/learning_curve", "report/timeline"} <= set(events.Tags()["images"])


def test_a_run_leaves_an_mlflow_run_on_the_server_with_the_same_final_metrics(tracked_run, servers):
    from mlflow import MlflowClient

    record = json.loads((tracked_run / "tracking.json").read_text())
    assert record["failed"] == {} and record["mlflow"]["tracking_uri"] == servers[0].url
    client = MlflowClient(tracking_uri=servers[0].url)
    run = client.get_run(record["mlflow"]["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "tracked"
    assert client.get_experiment(run.info.experiment_id).name == "braid-test"
    want = {f"summary/{k}": v for k, v in _numbers(tracked_run / "summary.json").items()}
    for name, suite in json.loads((tracked_run / "summary.json").read_text())["suites"].items():
        for when in ("before", "after"):  # every evaluation suite's warm-start and final score
            want[f"summary/suite/{name}/{when}"] = suite[when]["accuracy"]
            want[f"summary/suite/{name}/{when}_stderr"] = suite[when]["stderr"]
    assert {k: v for k, v in run.data.metrics.items() if k.startswith("summary/")} == {
        k: pytest.approx(v) for k, v in want.items()}
    rows = [json.loads(x) for x in (tracked_run / "metrics.jsonl").read_text().splitlines()]
    history = client.get_metric_history(run.info.run_id, "reward_mean")
    assert (sorted((m.step, m.value) for m in history)
            == [(r["iteration"], pytest.approx(r["reward_mean"])) for r in rows])
    config = json.loads((tracked_run / "config.json").read_text())
    assert run.data.params["trainer.mode"] == config["trainer"]["mode"]
    assert run.data.params["trainer.lr"] == str(config["trainer"]["lr"])
    assert run.data.params["tracking"] == '["tensorboard", "mlflow"]'
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "report")}
    assert {"report/report.md", "report/learning_curve.png", "report/timeline.png"} <= artifacts


def test_wandb_offline_keeps_the_run_for_a_later_sync(tracked_run, tmp_path):
    from flows.tracking import RunTracking, build_trackers

    run_dir = tmp_path / "tracked"
    shutil.copytree(tracked_run, run_dir, ignore=shutil.ignore_patterns("tensorboard", "tracking.json"))
    tracking = RunTracking(run_dir, build_trackers(run_dir, ["wandb"]), _logger(), interval_s=0.05)
    tracking.start()
    tracking.finish(ok=True)
    record = json.loads((run_dir / "tracking.json").read_text())
    assert record["failed"] == {} and record["wandb"]["mode"] == "offline" and record["rows_logged"] == 2
    [offline] = (run_dir / "wandb").glob(f"offline-run-*-{record['wandb']['run_id']}")
    [log] = offline.glob("*.wandb")
    names = (b"reward_mean", b"final_accuracy", b"staleness_mean", b"group_size")
    deadline = time.monotonic() + 60  # W&B's service writes the log after finish() returns (seen under load)
    while not all(n in log.read_bytes() for n in names) and time.monotonic() < deadline:
        time.sleep(0.5)
    data = log.read_bytes()  # the run's records, which `wandb sync` uploads: every name is there
    for name in names:
        assert name in data, name
    assert list((offline / "files" / "media" / "images" / "report").glob("learning_curve_*.png"))
    assert (offline / "files" / "report.md").exists()


def test_an_mlflow_server_gone_mid_run_is_reported_once_and_the_rest_is_tracked(tracked_run, servers, tmp_path,
                                                                                 monkeypatch, caplog):
    import logging

    from flows.tracking import RunTracking, build_trackers

    monkeypatch.setenv("MLFLOW_TRACKING_URI", servers[1].url)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # a dead server fails the call at once
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    run_dir = tmp_path / "dying"
    run_dir.mkdir()
    shutil.copy(tracked_run / "config.json", run_dir)
    rows = (tracked_run / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run_dir / "metrics.jsonl").write_text(rows[0])
    tracking = RunTracking(run_dir, build_trackers(run_dir, ["mlflow", "tensorboard"]), _logger(), interval_s=0.05)
    with caplog.at_level(logging.WARNING):
        tracking.start()
        deadline = time.monotonic() + 120
        while tracking.seen < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        servers[1].stop()
        with (run_dir / "metrics.jsonl").open("a") as f:
            f.write(rows[1])
        shutil.copy(tracked_run / "summary.json", run_dir)
        tracking.finish(ok=True)
    warnings = [r.getMessage() for r in caplog.records if "tracker mlflow failed" in r.getMessage()]
    assert len(warnings) == 1, warnings
    record = json.loads((run_dir / "tracking.json").read_text())
    assert list(record["failed"]) == ["mlflow"] and record["rows_logged"] == 2
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("reward_mean")] == [0, 1]  # the other tracker got everything
    assert len(events.Scalars("summary/final_accuracy")) == 1


def _logger():
    import logging

    return logging.getLogger("braid.test.tracking")
