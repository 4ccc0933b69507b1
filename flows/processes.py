"""Process supervision and the service starters: each service runs as a child process.

Each service runs as ``python -m <module>`` with its stdout/stderr in a log file in the run
directory. ``Supervisor.check`` raises ``ServiceDied`` with the tail of the dead process's log
when any supervised process exits unexpectedly; ``stop_all`` sends SIGTERM, then SIGKILL
after a grace period. ``start_relays``, ``start_instances``, ``start_router`` and
``start_trainer`` (one process or ``trainer.ranks`` data-parallel ranks) start the services of a
run; ``flows.launcher`` (one host), ``flows.site_services`` (one site of a deployment) and
``flows.scaleout`` (units added at run time) use them; ``start_env_workers`` the environment
workers of an agentic run.

SGS instances run one per process (``sgs-i``), or, with the emulated engine,
``generation.emulation.instances_per_process`` per process (``sgs-i-j`` serves instances i..j,
each on its own port): ``instance_groups`` cuts them, ``instance_service`` names the process of
an instance, ``restartable_group`` starts a dead one again with all its instances on their ports.

The supervisor holds every port it starts a server on (``Supervisor.ports``, ``flows.ports``) until
``stop_all``, so that no other process draws a dead server's port before its restart.
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

from flows.ports import PortReservations

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
    restart: Callable[[], None] | None = None  # starts it again on its address (a relay, the router)

    def describe_exit(self) -> str:
        return (f"{self.name} exited with code {self.proc.returncode}; last lines of {self.log_path}:\n"
                f"{tail(self.log_path)}")


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (another user's counts; a zombie, exited but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child (ours, not yet reaped) counts as dead
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


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
    def __init__(self, run_dir: Path, max_restarts: int = 0) -> None:
        """``max_restarts``: how often a server started with a ``restart`` (a relay, the router)
        is started again on its address after it died, before its death ends the run."""
        self.run_dir = run_dir
        self.max_restarts = max_restarts
        self.services: list[Service] = []
        self.lost: list[Service] = []  # tolerated exits, already reported
        self.restarts: dict[str, int] = {}  # by service name
        self._ignoring: list[Service] = []
        self.ports = PortReservations()  # the servers' ports, held across their deaths (``flows.ports``)

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
        ignore = [*(ignore or ()), *self._ignoring]  # a restart's own waiting checks what its caller checks
        for svc in list(self.services):
            code = svc.proc.poll()
            # gone from the list meanwhile: a restart's own wait (a nested check) already restarted it
            if code is None or svc in self.lost or svc in ignore or svc not in self.services:
                continue
            if svc.restart is not None and self.restarts.get(svc.name, 0) < self.max_restarts:
                self._ignoring = ignore
                try:
                    self._restart(svc)
                finally:
                    self._ignoring = []
                continue
            if svc.tolerate_exit and any(s.proc.poll() is None for s in self.services if s.tolerate_exit):
                self.lost.append(svc)
                log.warning("%s", svc.describe_exit())
                continue
            if not svc.expect_exit or code != 0:
                raise ServiceDied(svc.describe_exit())

    def _restart(self, svc: Service) -> None:
        """Start a dead server again on its address; the restart goes to ``recovery/services.jsonl``."""
        died_at = time.time()
        n = self.restarts[svc.name] = self.restarts.get(svc.name, 0) + 1
        log.warning("%s; restarting it (%d of %d)", svc.describe_exit(), n, self.max_restarts)
        self.services.remove(svc)
        svc.log_path.replace(svc.log_path.with_name(f"{svc.log_path.stem}.{svc.proc.pid}.log"))
        svc.restart()  # starts it under the same name (and marks it restartable again)
        _note_restart(self.run_dir, {"service": svc.name, "exit_code": svc.proc.returncode, "died_at": died_at,
                                     "ready_at": time.time(), "attempt": n}, "services.jsonl")

    def restartable(self, name: str, restart: Callable[[], None]) -> None:
        """Mark the running service ``name`` as one ``check`` starts again (``restart()``) when it dies."""
        svc = next(s for s in reversed(self.services) if s.name == name)
        svc.restart = restart

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
        self.ports.release_all()


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
    port = sup.ports.hold(host, port)
    tls_port = None if tls_port is None else sup.ports.hold(host, tls_port)
    args = ["--host", host, "--port", str(port), "--port-file", str(port_file), "--id", name,
            "--keep", str(keep), "--max-message-mb", str(max_message_mb)]
    args += [] if shm else ["--no-shm"]
    args += ["--data-path", data_path]  # how it forwards to its peers (weights.data_path)
    args += ["--site", site] if site else []
    args += ["--tls-dir", tls_dir] if tls_dir else []
    args += ["--tls-host", host, "--tls-port", str(tls_port)] if tls_port is not None else []
    sup.start(name, "services.weights", args, threads=1)
    ports = sup.wait_for_file(port_file, SGS_READY_TIMEOUT_S).split()
    tls_port = int(ports[1]) if len(ports) > 1 else None
    sup.restartable(name, lambda: start_relay(  # on the same ports: its peers and instances find it again
        sup, run_dir, name, keep=keep, shm=shm, max_message_mb=max_message_mb, host=host, port=int(ports[0]), site=site,
        tls_dir=tls_dir, tls_port=tls_port, data_path=data_path))
    return f"{host}:{ports[0]}", tls_port


def start_relays(sup: Supervisor, run_dir: Path, n: int, *, keep: int, shm: bool, max_message_mb: int,
                 data_path: str = "tcp") -> list[str]:
    """Start ``n`` weight relay processes (``relay-i``; the first is the master) and return their
    loopback addresses."""
    return [
        start_relay(sup, run_dir, f"relay-{i}", keep=keep, shm=shm, max_message_mb=max_message_mb,
                    data_path=data_path)[0]
        for i in range(n)
    ]


def instances_per_process(gen_cfg) -> int:
    """SGS instances one process serves for ``generation`` config ``gen_cfg``: the emulated engine's
    ``emulation.instances_per_process``; 1 for the other engines (vllm and hf hold a model each)."""
    if gen_cfg.engine == "emulated" and gen_cfg.emulation is not None:
        return gen_cfg.emulation.instances_per_process
    return 1


def standby_instances(cfg) -> int:
    """Standby SGS instances the launcher starts beside the run's own: the scale-out pool
    (``scaleout.max_instances - generation.instances``) on the emulated engine, whose processes
    serve many instances each and an idle instance costs nothing (``flows.scaleout.StandbyUnits``);
    0 otherwise (an added vllm or hf instance is a process of its own, started when added)."""
    if not cfg.scaleout.enabled or cfg.generation.engine != "emulated":
        return 0
    return max(0, cfg.scaleout.max_instances - cfg.generation.instances)


def instance_groups(first: int, n: int, per_process: int) -> list[range]:
    """The instances each SGS process serves: ``first .. first + n - 1`` cut in order into
    ceil(n / per_process) runs of ``per_process`` (the last one shorter when it does not divide)."""
    if n < 0 or per_process < 1:
        raise ValueError(f"instance_groups needs n >= 0 and per_process >= 1, got {n}, {per_process}")
    return [range(start, min(start + per_process, first + n)) for start in range(first, first + n, per_process)]


def group_service(group: range) -> str:
    """The supervised process (and its log and port files) serving ``group``: ``sgs-i`` for one
    instance, ``sgs-i-j`` for instances i..j."""
    return f"sgs-{group.start}" if len(group) == 1 else f"sgs-{group.start}-{group[-1]}"


def instance_service(i: int, groups: list[range]) -> str:
    """The name of the process serving instance ``i`` (``groups`` as ``instance_groups`` cut them)."""
    group = next((g for g in groups if i in g), None)
    if group is None:
        raise KeyError(f"instance {i} is in none of the groups {groups}")
    return group_service(group)


def start_instances(
    sup: Supervisor, run_dir: Path, checkpoint: str, n: int, threads: int, *, tolerate_exit: bool = False,
    host: str = "127.0.0.1", base_port: int = 0, config: Path | None = None, relays: list[str] | None = None,
    first: int = 0, cpus: list[int] | None = None, tls: tuple[str, str] | None = None, per_process: int = 1,
    ports: list[int] | None = None,
) -> list[str]:
    """Start ``n`` SGS instances (i = ``first`` ...) and return their ``host:port`` addresses in
    instance order. With ``tolerate_exit`` the run survives the death of some (not all) of their
    processes. Instance ``i`` binds ``host:base_port + i`` (``base_port`` 0: any free port), or
    ``ports[i - first]`` when ``ports`` is given (a restart on the ports they had); ``config``
    defaults to the run directory's ``config.json``. With ``relays``, instance i pulls weights from
    relay ``i % len(relays)``; ``cpus`` pins them (default: ``generation.cpus``); ``tls`` = (`braid
    certs` directory, site): they serve mutual TLS. ``per_process`` (``instances_per_process``):
    each process serves up to that many (``instance_groups``; more than one for the emulated engine
    only), named by ``group_service``; ``instance_service`` finds the one serving an instance."""
    if ports is not None and len(ports) != n:
        raise ValueError(f"start_instances: {len(ports)} ports for {n} instances")
    wanted = ports or [base_port + i if base_port else 0 for i in range(first, first + n)]
    ports = [sup.ports.hold(host, p) for p in wanted]  # held across the process's deaths (flows.ports)
    common = ["--config", str(config or run_dir / "config.json"), "--model", checkpoint, "--host", host]
    common += ["--cpus", ",".join(map(str, cpus))] if cpus else []
    common += ["--tls-dir", tls[0], "--tls-site", tls[1]] if tls else []
    port_files = []
    for group in instance_groups(first, n, per_process):
        name = group_service(group)
        port_file = run_dir / f"{name}.port"
        port_file.unlink(missing_ok=True)
        own = ports[group.start - first:group.stop - first]
        args = [*common, "--port-file", str(port_file), "--instance", str(group.start)]
        args += ["--port", str(own[0])] if len(group) == 1 else \
            ["--instances", str(len(group)), "--ports", ",".join(map(str, own))]
        if relays:  # the process deals its list round-robin from its first instance: instance i gets relays[i % R]
            args += ["--relay", ",".join(relays[i % len(relays)] for i in group[:len(relays)])]
        sup.start(name, "services.generation", args, threads=threads, tolerate_exit=tolerate_exit)
        port_files.append(port_file)
    return [f"{host}:{port}" for p in port_files for port in sup.wait_for_file(p, SGS_READY_TIMEOUT_S).split()]


def restartable_group(sup: Supervisor, first: int, ports: list[int],
                      start_group: Callable[[int, list[int]], object]) -> None:
    """Mark the process serving instances ``first .. first + len(ports) - 1`` (one process: see
    ``group_service``) as a server the supervisor starts again on ``ports`` when it dies
    (``start_group(first, ports)``: ``start_instances`` for those, in one process, marked again each
    time); the rollout orchestrator readmits an instance that answers again (``services.rollout.readmit``)."""

    def again() -> None:
        start_group(first, ports)
        restartable_group(sup, first, ports, start_group)

    sup.restartable(group_service(range(first, first + len(ports))), again)


def start_env_worker(sup: Supervisor, run_dir: Path, name: str, *, config: Path | None = None, host: str = "127.0.0.1",
                     port: int = 0) -> str:
    """Start one environment worker process ``name`` (``python -m services.agentic``, the run's
    ``agentic`` section) and return its address. A worker that dies is started again on the same
    port (its trajectories are dropped and counted by the trainer; new ones reach it again)."""
    port_file = run_dir / f"{name}.port"
    port_file.unlink(missing_ok=True)
    port = sup.ports.hold(host, port)
    args = ["--config", str(config or run_dir / "config.json"), "--host", host, "--port", str(port),
            "--port-file", str(port_file), "--id", name]
    sup.start(name, "services.agentic", args, threads=1)
    bound = int(sup.wait_for_file(port_file, SGS_READY_TIMEOUT_S))
    sup.restartable(name, lambda: start_env_worker(sup, run_dir, name, config=config, host=host, port=bound))
    return f"{host}:{bound}"


def start_env_workers(sup: Supervisor, run_dir: Path, n: int, *, config: Path | None = None) -> list[str]:
    """Start ``n`` environment workers (``env-i``); return their loopback addresses."""
    return [start_env_worker(sup, run_dir, f"env-{i}", config=config) for i in range(n)]


def router_enabled(cfg) -> bool:
    """Whether the run puts the SGS router in front of its instances (``RunConfig.uses_router``)."""
    return cfg.uses_router


def start_router(
    sup: Supervisor, run_dir: Path, checkpoint: str, instances: list[str], *, host: str = "127.0.0.1", port: int = 0,
    config: Path | None = None, tls: tuple[str, str] | None = None, restartable: bool = True,
) -> str:
    """Start the SGS router (``router``) over ``instances`` bound to ``host:port`` (0: any free
    port); return its address. ``tls`` = (`braid certs` directory, site): serve mutual TLS.
    ``restartable``: a router that dies is started again on the same port over the same
    instances (not when instances join and leave at run time: scale-out)."""
    port_file = run_dir / "router.port"
    port_file.unlink(missing_ok=True)
    port = sup.ports.hold(host, port)
    args = ["--config", str(config or run_dir / "config.json"), "--model", checkpoint,
            "--instances", ",".join(instances),
            "--host", host, "--port", str(port), "--port-file", str(port_file),
            "--timeline", str(run_dir / "router-timeline.jsonl")]
    args += ["--tls-dir", tls[0], "--tls-site", tls[1]] if tls else []
    sup.start("router", "services.generation.router_main", args, threads=1)
    bound = int(sup.wait_for_file(port_file, SGS_READY_TIMEOUT_S))
    if restartable:
        sup.restartable("router", lambda: start_router(sup, run_dir, checkpoint, instances, host=host, port=bound,
                                                       config=config, tls=tls))
    return f"{host}:{bound}"


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
        # the next attempt's log is fresh
        svc.log_path.replace(svc.log_path.with_name(f"{svc.log_path.stem}.{svc.proc.pid}.log"))


def _note_restart(run_dir: Path, record: dict, file: str = "restarts.jsonl") -> None:
    path = run_dir / "recovery" / file
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def start_trainer(sup: Supervisor, cfg, args: list[str]) -> Service:
    """The trainer: one process, or ``trainer.ranks`` data-parallel ranks with torchrun's
    environment (rank 0, returned, is the one that reads the stream and writes the summary; the
    others are supervised like it and exit when it tells them to)."""
    ranks = cfg.trainer.ranks
    if ranks == 1:
        return sup.start("trainer", "services.run", args, threads=cfg.trainer.threads, expect_exit=True,
                         env={"WORLD_SIZE": "1"})  # not a rank of some outer torchrun
    # the rendezvous port of this run's process group
    common = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(ranks)}
    for rank in range(ranks - 1, -1, -1):
        env = {**common, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        svc = sup.start("trainer" if rank == 0 else f"trainer-rank{rank}", "services.run", args,
                        threads=cfg.trainer.threads, expect_exit=True, env=env)
    return svc
