"""Process supervision and the service starters: each service runs as a child process.

Each service runs as ``python -m <module>`` with its stdout/stderr in a log file in the run
directory. ``Supervisor.check`` raises ``ServiceDied`` with the tail of the dead process's log
when any supervised process exits unexpectedly; ``stop_all`` sends SIGTERM, then SIGKILL
after a grace period. ``start_relays``, ``start_instances``, ``start_router`` and
``start_trainer`` (one process or ``trainer.ranks`` data-parallel ranks) start the services of a
run; ``flows.launcher`` (one host), ``flows.site_services`` (one site of a deployment) and
``flows.scaleout`` (units added at run time) use them.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("braid.launcher")

TAIL_LINES = 40
SGS_READY_TIMEOUT_S = 180


class ServiceDied(RuntimeError):
    """A supervised process exited unexpectedly; the message carries its log tail."""


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    if not path.exists():
        return "<no log>"
    text = path.read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


@dataclass
class Service:
    name: str
    proc: subprocess.Popen
    log_path: Path
    expect_exit: bool = False  # a job that finishes (trainer) rather than a server
    tolerate_exit: bool = False  # a replaceable server (an SGS instance in bounded mode): its death is logged

    def describe_exit(self) -> str:
        return f"{self.name} exited with code {self.proc.returncode}; last lines of {self.log_path}:\n{tail(self.log_path)}"


def free_port() -> int:
    """A loopback port free now (for a listener that cannot take port 0 and report back)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_VERBOSITY="error",
        PYTHONUNBUFFERED="1",
        PYTHONWARNINGS="ignore",
    )
    return env


class Supervisor:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.services: list[Service] = []
        self.lost: list[Service] = []  # tolerated exits, already reported

    def start(
        self, name: str, module: str, args: list[str], *, threads: int, expect_exit: bool = False,
        tolerate_exit: bool = False, env: dict[str, str] | None = None,
    ) -> Service:
        log_path = self.run_dir / f"{name}.log"
        log = log_path.open("w")
        proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**child_env(threads), **(env or {})},
            start_new_session=True,
        )
        log.close()
        svc = Service(name, proc, log_path, expect_exit, tolerate_exit)
        self.services.append(svc)
        return svc

    def check(self, ignore: list[Service] | None = None) -> None:
        """Raise ``ServiceDied`` if a server exited, or a job exited non-zero (not those in ``ignore``)."""
        for svc in self.services:
            code = svc.proc.poll()
            if code is None or svc in self.lost or svc in (ignore or ()):
                continue
            if svc.tolerate_exit and any(s.proc.poll() is None for s in self.services if s.tolerate_exit):
                self.lost.append(svc)
                log.warning("%s", svc.describe_exit())
                continue
            if not svc.expect_exit or code != 0:
                raise ServiceDied(svc.describe_exit())

    def wait_for_file(self, path: Path, timeout_s: float) -> str:
        """Wait until ``path`` exists (e.g. a port file) while checking the services."""
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            self.check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} did not appear within {timeout_s:.0f}s")
            time.sleep(0.1)
        return path.read_text().strip()

    def stop_all(self, grace_s: float = 10.0) -> None:
        for svc in reversed(self.services):
            if svc.proc.poll() is None:
                svc.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for svc in reversed(self.services):
            remaining = max(0.1, deadline - time.monotonic())
            try:
                svc.proc.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                svc.proc.kill()
                svc.proc.wait()


def start_relay(
    sup: Supervisor, run_dir: Path, name: str, *, keep: int, shm: bool, max_message_mb: int,
    host: str = "127.0.0.1", port: int = 0, site: str = "", tls_dir: str = "", tls_port: int | None = None,
    data_path: str = "tcp",
) -> tuple[str, int | None]:
    """Start one weight relay process ``name``; return (its ``host:port``, its TLS port or None).

    With ``site`` and ``tls_dir`` the relay uses that site's certificate as a client of other
    sites' relays; with ``tls_port`` too it also serves other sites there (mutual TLS)."""
    port_file = run_dir / f"{name}.port"
    port_file.unlink(missing_ok=True)
    args = ["--host", host, "--port", str(port), "--port-file", str(port_file), "--id", name,
            "--keep", str(keep), "--max-message-mb", str(max_message_mb)]
    args += [] if shm else ["--no-shm"]
    args += ["--data-path", data_path]  # how it forwards to its peers (weights.data_path)
    args += ["--site", site] if site else []
    args += ["--tls-dir", tls_dir] if tls_dir else []
    args += ["--tls-host", host, "--tls-port", str(tls_port)] if tls_port is not None else []
    sup.start(name, "services.weights", args, threads=1)
    ports = sup.wait_for_file(port_file, SGS_READY_TIMEOUT_S).split()
    return f"{host}:{ports[0]}", int(ports[1]) if len(ports) > 1 else None


def start_relays(sup: Supervisor, run_dir: Path, n: int, *, keep: int, shm: bool, max_message_mb: int,
                 data_path: str = "tcp") -> list[str]:
    """Start ``n`` weight relay processes (``relay-i``; the first is the master) and return their
    loopback addresses."""
    return [
        start_relay(sup, run_dir, f"relay-{i}", keep=keep, shm=shm, max_message_mb=max_message_mb,
                    data_path=data_path)[0]
        for i in range(n)
    ]


def start_instances(
    sup: Supervisor, run_dir: Path, checkpoint: str, n: int, threads: int, *, tolerate_exit: bool = False,
    host: str = "127.0.0.1", base_port: int = 0, config: Path | None = None, relays: list[str] | None = None,
    first: int = 0, cpus: list[int] | None = None, tls: tuple[str, str] | None = None,
) -> list[str]:
    """Start ``n`` SGS instance processes (``sgs-i`` for i = ``first`` ...) and return their
    ``host:port`` addresses. With ``tolerate_exit`` the run survives the death of some (not all)
    instances. Instance ``i`` binds ``host:base_port + i`` (``base_port`` 0: any free port);
    ``config`` defaults to the run directory's ``config.json``. With ``relays``, instance i pulls
    weights from relay ``i % len(relays)``; ``cpus`` pins them (default: ``generation.cpus``);
    ``tls`` = (`braid certs` directory, site): they serve mutual TLS."""
    config_path = str(config or run_dir / "config.json")
    port_files = []
    for i in range(first, first + n):
        port_file = run_dir / f"sgs-{i}.port"
        port_file.unlink(missing_ok=True)
        port = base_port + i if base_port else 0
        args = ["--config", config_path, "--model", checkpoint, "--host", host, "--port", str(port),
                "--port-file", str(port_file), "--instance", str(i)]
        args += ["--relay", relays[i % len(relays)]] if relays else []
        args += ["--cpus", ",".join(map(str, cpus))] if cpus else []
        args += ["--tls-dir", tls[0], "--tls-site", tls[1]] if tls else []
        sup.start(f"sgs-{i}", "services.generation", args, threads=threads, tolerate_exit=tolerate_exit)
        port_files.append(port_file)
    return [f"{host}:{sup.wait_for_file(p, SGS_READY_TIMEOUT_S)}" for p in port_files]


def router_enabled(cfg) -> bool:
    """Whether the run puts the SGS router in front of its instances (``generation.dispatch.router``)."""
    mode = cfg.generation.dispatch.router
    if mode == "auto" and cfg.scaleout.enabled:  # instances join and leave through the router
        return True
    return mode == "on" or (mode == "auto" and cfg.generation.instances > 1 and cfg.trainer.mode != "bounded")


def start_router(
    sup: Supervisor, run_dir: Path, checkpoint: str, instances: list[str], *, host: str = "127.0.0.1", port: int = 0,
    config: Path | None = None, tls: tuple[str, str] | None = None,
) -> str:
    """Start the SGS router (``router``) over ``instances`` bound to ``host:port`` (0: any free
    port); return its address. ``tls`` = (`braid certs` directory, site): serve mutual TLS."""
    port_file = run_dir / "router.port"
    port_file.unlink(missing_ok=True)
    args = ["--config", str(config or run_dir / "config.json"), "--model", checkpoint, "--instances", ",".join(instances),
            "--host", host, "--port", str(port), "--port-file", str(port_file),
            "--timeline", str(run_dir / "router-timeline.jsonl")]
    args += ["--tls-dir", tls[0], "--tls-site", tls[1]] if tls else []
    sup.start("router", "services.generation.router_main", args, threads=1)
    return f"{host}:{sup.wait_for_file(port_file, SGS_READY_TIMEOUT_S)}"


def trainer_ranks(sup: Supervisor) -> list[Service]:
    """The supervised processes of the trainer (rank 0 ``trainer``, ranks ``trainer-rankN``)."""
    return [s for s in sup.services if s.name == "trainer" or s.name.startswith("trainer-rank")]


def supervise_trainer(
    sup: Supervisor, start: Callable[[int, float | None], Service], max_restarts: int,
    tick: Callable[[], bool], poll_s: float,
) -> int:
    """Run the trainer to its end: ``start(attempt, died_at)`` starts it (attempt 0, then each
    restart); a trainer process that dies (non-zero exit, a signal) stops its other ranks and is
    started again, resuming from its recovery checkpoint, up to ``max_restarts`` times (then
    ``ServiceDied`` with its log tail); the other services stay up. ``tick()`` runs every
    ``poll_s`` (it checks the other services first); True stops waiting (returns -1). Returns the
    number of restarts. Each restart is appended to ``recovery/restarts.jsonl``."""
    restarts = 0
    trainer = start(0, None)
    while True:
        dead = next((s for s in trainer_ranks(sup) if s.proc.poll() not in (None, 0)), None)
        if dead is not None:
            if restarts >= max_restarts:
                raise ServiceDied(dead.describe_exit() + (f"\n(after {restarts} restarts)" if restarts else ""))
            died_at = time.time()
            restarts += 1
            log.warning("%s; restart %d of %d", dead.describe_exit(), restarts, max_restarts)
            _retire(sup, trainer_ranks(sup))
            _note_restart(sup.run_dir, {"attempt": restarts, "service": dead.name, "exit_code": dead.proc.returncode,
                                        "died_at": died_at})
            trainer = start(restarts, died_at)
            continue
        if trainer.proc.poll() == 0:
            return restarts
        sup.check(ignore=trainer_ranks(sup))  # a server died
        if tick():
            return -1
        time.sleep(poll_s)


def _retire(sup: Supervisor, services: list[Service], grace_s: float = 10.0) -> None:
    """Stop these services (what is left of a dead trainer) and forget them."""
    for svc in services:
        if svc.proc.poll() is None:
            svc.proc.send_signal(signal.SIGTERM)
    for svc in services:
        try:
            svc.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            svc.proc.kill()
            svc.proc.wait()
        sup.services.remove(svc)
        svc.log_path.replace(svc.log_path.with_name(f"{svc.log_path.stem}.{svc.proc.pid}.log"))  # the next attempt's log is fresh


def _note_restart(run_dir: Path, record: dict) -> None:
    path = run_dir / "recovery" / "restarts.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def start_trainer(sup: Supervisor, cfg, args: list[str]) -> Service:
    """The trainer: one process, or ``trainer.ranks`` data-parallel ranks with torchrun's
    environment (rank 0, returned, is the one that reads the stream and writes the summary; the
    others are supervised like it and exit when it tells them to)."""
    ranks = cfg.trainer.ranks
    if ranks == 1:
        return sup.start("trainer", "services.trainer", args, threads=cfg.trainer.threads, expect_exit=True,
                         env={"WORLD_SIZE": "1"})  # not a rank of some outer torchrun
    # the rendezvous port of this run's process group
    common = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(ranks)}
    for rank in range(ranks - 1, -1, -1):
        env = {**common, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        svc = sup.start("trainer" if rank == 0 else f"trainer-rank{rank}", "services.trainer", args,
                        threads=cfg.trainer.threads, expect_exit=True, env=env)
    return svc
