"""A run's numbers into the user's experiment trackers (config ``tracking``; docs/tracking.md).

``RunTracking`` follows a run directory from the flow process, on a thread of its own: each
tracker gets the resolved config as parameters when the run starts, every ``metrics.jsonl`` row's
numbers at the row's ``iteration`` (the same names: a dict of numbers becomes ``key/sub``, so the
suites scored between steps are ``suite_accuracy/<suite>``; strings and lists are left out), and at the
end ``summary.json``'s numbers as ``summary/*`` (each suite's warm-start and final accuracy as
``summary/suite/<suite>/before`` and ``/after``) at step ``iterations`` with the report (``report.md``
and its plots). It never touches training: the
trainer only writes its files. A tracker that raises (its server gone, a full disk) is reported
once in the flow's log and in ``tracking.json``, then left alone; the run goes on. The end waits
at most ``finish_timeout_s`` for the trackers before the flow returns.

A run rolled back to its recovery checkpoint drops rows from ``metrics.jsonl``; the iterations run
again are logged again at their steps (TensorBoard and MLflow keep both values; W&B keeps the first).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from flows.artifacts import read_metrics
from flows.trackers import PACKAGES, TRACKERS, Tracker
from services.common.config_errors import ConfigError

_NOT_IN_KEY = re.compile(r"[^0-9A-Za-z_\-./ ]")  # the characters every tracker takes in a metric name


def metric_key(key: str) -> str:
    return _NOT_IN_KEY.sub("_", key)


def _number(value: object) -> bool:
    return isinstance(value, (bool, int, float))


def row_metrics(row: dict) -> dict[str, float]:
    """One ``metrics.jsonl`` row's numbers under its own names (``iteration`` is the step)."""
    out: dict[str, float] = {}
    for key, value in row.items():
        if key == "iteration":
            continue
        if _number(value):
            out[metric_key(key)] = float(value)
        elif isinstance(value, dict):
            out.update({metric_key(f"{key}/{sub}"): float(v) for sub, v in value.items() if _number(v)})
    return out


def summary_metrics(summary: dict) -> dict[str, float]:
    """``summary.json``'s numbers as ``summary/*``, and each evaluation suite's warm-start and final accuracy
    and standard error as ``summary/suite/<name>/{before,after}{,_stderr}``."""
    out = {f"summary/{metric_key(k)}": float(v) for k, v in summary.items() if _number(v)}
    for name, suite in (summary.get("suites") or {}).items():
        for when in ("before", "after"):
            key = metric_key(f"summary/suite/{name}/{when}")
            out |= {key: float(suite[when]["accuracy"]), f"{key}_stderr": float(suite[when]["stderr"])}
    return out


def flat_params(config: dict, prefix: str = "") -> dict[str, str | int | float | bool]:
    """The resolved config as dotted keys (``trainer.lr``); lists and nulls as JSON text."""
    out: dict[str, str | int | float | bool] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_params(value, f"{name}."))
        else:
            out[name] = value if isinstance(value, (str, int, float, bool)) else json.dumps(value)
    return out


def build_trackers(run_dir: Path, names: list[str], factories: dict[str, Callable] = TRACKERS) -> list[Tracker]:
    trackers = []
    for name in names:
        try:
            trackers.append(factories[name](run_dir))
        except ImportError as err:
            raise ConfigError(f"tracking: {name} needs the {PACKAGES.get(name, name)} package ({err}); "
                              "install it with pip install 'braid-rl[tracking]'") from None
    return trackers


class RunTracking:
    def __init__(self, run_dir: Path, trackers: list[Tracker], logger: logging.Logger | logging.LoggerAdapter,
                 interval_s: float = 2.0, finish_timeout_s: float = 120.0) -> None:
        self.run_dir, self.trackers, self.logger = run_dir, trackers, logger
        self.interval_s, self.finish_timeout_s = interval_s, finish_timeout_s
        self.failed: dict[str, str] = {}
        self.seen = 0  # rows of metrics.jsonl logged
        self.step = -1  # the last row's iteration
        self.ok = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="braid-tracking", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def finish(self, ok: bool) -> None:
        """The last rows, the summary and the report to every live tracker; waits ``finish_timeout_s`` at most."""
        self.ok = ok
        self._stop.set()
        self._thread.join(self.finish_timeout_s)
        if self._thread.is_alive():
            self.logger.warning("trackers still busy after %g s; the run ends without waiting for them",
                                self.finish_timeout_s)
        self._write_record()

    def _follow(self) -> None:
        config = json.loads((self.run_dir / "config.json").read_text())
        params = flat_params(config)
        for tracker in self.trackers:
            self._call(tracker, "start", self.run_dir.name, params)
        while not self._stop.wait(self.interval_s):
            self.poll()
        self.poll()
        self._close()

    def poll(self) -> None:
        rows = read_metrics(self.run_dir / "metrics.jsonl")
        if len(rows) < self.seen:  # rolled back to a recovery checkpoint: what runs again is logged again
            self.seen = len(rows)
        for row in rows[self.seen:]:
            self.step = int(row["iteration"])
            metrics = row_metrics(row)
            for tracker in self.trackers:
                self._call(tracker, "log", self.step, metrics)
        self.seen = len(rows)

    def _close(self) -> None:
        path = self.run_dir / "summary.json"
        summary = json.loads(path.read_text()) if path.exists() else {}
        step = int(summary.get("iterations", self.step + 1))
        files = [p for p in [self.run_dir / "report.md", *sorted(self.run_dir.glob("*.png"))] if p.is_file()]
        for tracker in self.trackers:
            self._call(tracker, "finish", step, summary_metrics(summary), files, self.ok and bool(summary))

    def _call(self, tracker: Tracker, what: str, *args) -> None:
        if tracker.name in self.failed:
            return
        try:
            getattr(tracker, what)(*args)
        except Exception as err:  # noqa: BLE001 -- whatever a tracker raises is reported once, never the run's
            self.failed[tracker.name] = f"{what}: {type(err).__name__}: {err}"
            self.logger.warning("tracker %s failed (%s: %s); the run goes on without it",
                                tracker.name, what, str(err).splitlines()[0] if str(err) else type(err).__name__)

    def _write_record(self) -> None:
        record = {"trackers": [t.name for t in self.trackers], "rows_logged": self.seen, "failed": self.failed,
                  **{t.name: t.where() for t in self.trackers}}
        (self.run_dir / "tracking.json").write_text(json.dumps(record, indent=2) + "\n")


@contextmanager
def tracked(run_dir: Path, names: list[str], logger: logging.Logger | logging.LoggerAdapter) -> Iterator[None]:
    """Track the run in ``run_dir`` while the block runs (nothing when ``names`` is empty)."""
    if not names:
        yield
        return
    tracking = RunTracking(run_dir, build_trackers(run_dir, names), logger)
    logger.info("tracking to %s", ", ".join(f"{t.name} ({t.where()})" for t in tracking.trackers))
    tracking.start()
    ok = False
    try:
        yield
        ok = True
    finally:
        tracking.finish(ok)
