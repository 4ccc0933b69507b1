"""Helpers for the weight-plane tests: relay processes on free loopback ports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class RelayProc:
    proc: subprocess.Popen
    address: str
    log: Path
    tls_address: str = ""

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


def start_relay(workdir: Path, name: str, *args: str, faults: str = "", port: int = 0) -> RelayProc:
    port_file, log = workdir / f"{name}.port", workdir / f"{name}.log"
    port_file.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    if faults:
        env["BRAID_RELAY_FAULTS"] = faults
    with log.open("a") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.weights", "--port", str(port), "--port-file", str(port_file), "--id", name, *args],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env,
        )
    deadline = time.monotonic() + 60
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"relay {name} did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)
    ports = port_file.read_text().split()
    tls = f"127.0.0.1:{ports[1]}" if len(ports) > 1 else ""
    return RelayProc(proc, f"127.0.0.1:{ports[0]}", log, tls)


def model_state(fill: float, scale: int = 1) -> dict[str, torch.Tensor]:
    """A small 'model' whose every value is ``fill`` (a torn read would mix two fills)."""
    return {
        "embed.weight": torch.full((256 * scale, 64), fill),
        "layer.0.w": torch.full((64, 64 * scale), fill),
        "layer.0.b": torch.full((64,), fill),
        "norm.weight": torch.full((64,), fill),
    }


def wait_for(pred, timeout_s: float, what: str, poll_s: float = 0.05) -> float:
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"{what} not within {timeout_s}s")
        time.sleep(poll_s)
    return time.monotonic() - t0
