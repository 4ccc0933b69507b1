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


def kill_instance_after_first_step(tmp_path: Path, killed: list[int], instance: str | None = "1",
                                   busy: bool = False) -> Callable[[], None]:
    """An ``on_poll`` that kills SGS instance ``instance`` of this run (None: any) once a metrics row
    exists, once; the pids it killed go to ``killed``. ``busy``: only at a poll where the instance's
    health says it is running requests, so trajectories are in flight on it when it dies (a test that
    counts the recovered ones does not depend on when the poll lands)."""

    def poll() -> None:
        if killed or not (tmp_path / "metrics.jsonl").read_text().strip():
            return
        if busy and not _running(tmp_path / f"sgs-{instance}.port"):
            return
        for proc in psutil.process_iter(["cmdline"]):
            cmd = proc.info["cmdline"] or []
            if cmd[1:3] != ["-m", "services.generation"] or str(tmp_path) not in " ".join(cmd):
                continue
            if instance is None or ("--instance" in cmd and cmd[cmd.index("--instance") + 1] == instance):
                proc.kill()
                killed.append(proc.pid)

    return poll


def _running(port_file: Path) -> bool:
    """Whether the SGS instance whose port file this is holds requests now (running or queued)."""
    import grpc

    from services.generation.client import GenerationClient

    try:
        with GenerationClient(f"127.0.0.1:{port_file.read_text().split()[0]}") as client:
            health = client.health(timeout_s=2.0)
    except (FileNotFoundError, IndexError, grpc.RpcError):  # not up yet: ask again at the next poll
        return False
    return health.running + health.waiting > 0
