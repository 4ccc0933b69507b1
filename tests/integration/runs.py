"""Shared helpers of the integration tests that launch whole runs (no Prefect): run the smoke
config with overrides through the launcher, and kill an SGS instance once the first step is in."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import psutil

from flows.launcher import run_processes
from services.common.config import load_config, write_config
from tests.conftest import FAST_ENGINE, ROOT


def run_smoke(tmp_path: Path, checkpoint, overrides: list[str], on_poll=None) -> tuple[dict, list[dict]]:
    """(summary, metrics rows) of a run of ``deploy/configs/smoke.yaml`` on the fast engine."""
    cfg = load_config(ROOT / "deploy/configs/smoke.yaml", [FAST_ENGINE, *overrides])
    write_config(cfg, tmp_path / "config.json")
    (tmp_path / "metrics.jsonl").write_text("")
    summary = json.loads(run_processes(tmp_path, str(checkpoint), on_poll=on_poll, poll_s=0.2).read_text())
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return summary, rows


def kill_instance_after_first_step(tmp_path: Path, killed: list[int], instance: str | None = "1") -> Callable[[], None]:
    """An ``on_poll`` that kills SGS instance ``instance`` of this run (None: any) once a metrics row
    exists, once; the pids it killed go to ``killed``."""

    def poll() -> None:
        if killed or not (tmp_path / "metrics.jsonl").read_text().strip():
            return
        for proc in psutil.process_iter(["cmdline"]):
            cmd = proc.info["cmdline"] or []
            if cmd[1:3] != ["-m", "services.generation"] or str(tmp_path) not in " ".join(cmd):
                continue
            if instance is None or ("--instance" in cmd and cmd[cmd.index("--instance") + 1] == instance):
                proc.kill()
                killed.append(proc.pid)

    return poll
