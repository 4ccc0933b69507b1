"""Helpers for the weight-plane tests: relay processes on free loopback ports."""

from __future__ import annotations

import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from tests.conftest import spawn_service, stop_service

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
        return stop_service(self.proc)


def start_relay(workdir: Path, name: str, *args: str, faults: str = "", port: int = 0) -> RelayProc:
    port_file, log = workdir / f"{name}.port", workdir / f"{name}.log"
    proc, ports = spawn_service(
        ["services.weights", "--port", str(port), "--port-file", str(port_file), "--id", name, *args],
        port_file, log, what=f"relay {name}", env={"BRAID_RELAY_FAULTS": faults} if faults else None,
        timeout_s=60.0, append_log=True,
    )
    tls = f"127.0.0.1:{ports[1]}" if len(ports) > 1 else ""
    return RelayProc(proc, f"127.0.0.1:{ports[0]}", log, tls)


@contextmanager
def running_relay(workdir: Path, name: str, *args: str, faults: str = ""):
    """A relay process and a ready client of it; the relay must stop cleanly afterwards."""
    from services.weights.client import RelayClient

    r = start_relay(workdir, name, *args, faults=faults)
    client = RelayClient(r.address)
    try:
        client.wait_ready()
        yield r, client
    finally:
        client.close()
        assert r.stop() == 0, r.log.read_text()[-3000:]


def state_equals(state: dict[str, torch.Tensor], fill: float) -> bool:
    ref = model_state(fill)
    return all(torch.equal(state[k], ref[k]) for k in ref)


def model_state(fill: float, scale: int = 1) -> dict[str, torch.Tensor]:
    """A small 'model' whose every value is ``fill`` (a torn read would mix two fills)."""
    return {
        "embed.weight": torch.full((256 * scale, 64), fill),
        "layer.0.w": torch.full((64, 64 * scale), fill),
        "layer.0.b": torch.full((64,), fill),
        "norm.weight": torch.full((64,), fill),
    }


def holds(client, version: int) -> bool:
    """``client``'s relay holds ``version`` complete (False while it is unreachable: a restarted
    relay's channel may still be reconnecting)."""
    import grpc

    try:
        state = client.versions(timeout_s=5).versions.get(version)
    except grpc.RpcError:
        return False
    return state is not None and state.complete


def wait_for(pred, timeout_s: float, what: str, poll_s: float = 0.05) -> float:
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"{what} not within {timeout_s}s")
        time.sleep(poll_s)
    return time.monotonic() - t0


def start_sgs_with_relay(workdir: Path, checkpoint: Path, relay: str, overrides: tuple[str, ...] = ()):
    """An SGS process (the fast engine, smoke config + ``overrides``) pulling from ``relay``."""
    from services.common.config import load_config, write_config
    from tests.conftest import FAST_ENGINE, SGSProcess

    cfg = load_config(ROOT / "deploy/configs/smoke.yaml", [FAST_ENGINE, "weights.sgs_auto_pull_s=0.5", *overrides])
    write_config(cfg, workdir / "config.json")
    port_file, log = workdir / "sgs-relay.port", workdir / "sgs-relay.log"
    proc, ports = spawn_service(
        ["services.generation", "--config", str(workdir / "config.json"), "--model", str(checkpoint),
         "--port", "0", "--port-file", str(port_file), "--relay", relay],
        port_file, log, what="SGS",
    )
    return SGSProcess(proc, f"127.0.0.1:{ports[0]}", log)
