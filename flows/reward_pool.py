"""The reward pool of a local run: reward worker processes, their membership file, elastic scaling.

``RewardPoolController.start()`` starts ``reward.workers`` worker processes (``python -m
services.reward``, names ``reward-0``, ``reward-1``, ..., logs ``<name>.log`` in the run
directory) through the launcher's ``Supervisor`` and writes the membership file
``reward-workers.json`` (``{"version": n, "workers": ["host:port", ...]}``, replaced atomically),
which every ``services.reward.client.RewardPool`` built on it follows. A worker that dies is
started again on its port by ``Supervisor.check`` (like a relay), so the membership file does
not change; the pools retry its calls on the other workers meanwhile.

``poll()`` lives in the launcher's watcher loop, like the SGS scale-out controller
(``flows/scaleout.py``). With ``reward.scaling.enabled`` each poll reads every worker's Health
(busy thread-seconds, requests queued), turns the change since the last poll into a
``LoadSample`` and asks the pure policy (``services.reward.scaling.decide``). The action runs on
one background thread (its failure is raised by the next ``poll``), so the watcher keeps
checking the other processes:

- ``out``: start worker ``reward-<next index>``, wait until it answers Health, add it to the
  membership file;
- ``in``: take the newest worker out of the membership file first (pools stop sending it calls),
  wait until its in-flight count is 0, then stop its process (SIGTERM).

Each action and each decision to change (a 'hold' at most every ``HOLD_LOG_EVERY_S``) is appended as a JSON
line to ``reward-scaling.jsonl``. The
policy's cooldown counts from when an action finished (the worker joined, or left).
"""

from __future__ import annotations

import contextvars
import json
import logging
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from flows.processes import Service, Supervisor, tail
from services.reward.client import RewardClient, RewardError, RewardPool, write_membership
from services.reward.scaling import LoadSample, PoolDecision, ScalingLimits, decide
from services.reward.worker import WorkerHealth

log = logging.getLogger("braid.reward_pool")
MEMBERSHIP = "reward-workers.json"
EVENTS = "reward-scaling.jsonl"
HEALTH_TIMEOUT_S = 2.0  # a poll never waits longer on one worker
DRAIN_SETTLE_S = 0.2  # after leaving the membership: calls already on their way reach the worker first
STOP_TIMEOUT_S = 10.0  # a stopped worker exits within its own 2 s grace; then SIGKILL
HOLD_LOG_EVERY_S = 10.0  # 'hold' decisions are logged at most this often (polls come every 0.5 s)
READY_TIMEOUT_S = 120.0  # a worker process starts in about a second (the model kind loads torch: a few)


class RewardPoolController:
    """The run's reward workers: ``start()``, then ``poll()`` from the watcher loop, ``close()`` at the end."""

    def __init__(self, sup: Supervisor, run_dir: Path, cfg, *, config: Path | None = None, host: str = "127.0.0.1",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sup, self.run_dir, self.cfg, self.host, self._clock = sup, run_dir, cfg, host, clock
        self.config = config or run_dir / "config.json"
        self.membership = run_dir / MEMBERSHIP
        self.events_path = run_dir / EVENTS
        self.limits = ScalingLimits.from_config(cfg.reward.scaling)
        self.members: list[tuple[str, Service]] = []  # in the membership file, oldest first
        self.version = 0
        self.history: list[LoadSample] = []
        self.last_change_s: float | None = None
        self._next_index = 0
        self._clients: dict[str, RewardClient] = {}
        self._last: tuple[float, dict[str, float]] | None = None  # (time, busy_s by address) of the previous poll
        self._lock = threading.Lock()
        self._log_lock = threading.Lock()
        self._busy: threading.Thread | None = None
        self._error: BaseException | None = None
        self._last_hold_logged = float("-inf")

    @property
    def addresses(self) -> list[str]:
        with self._lock:
            return [a for a, _ in self.members]

    def launch(self) -> list[tuple[str, Path, Service]]:
        """Start the ``reward.workers`` worker processes without waiting for them (``start`` waits):
        a launcher starts them before its SGS instances, whose start-up they then overlap."""
        return [self._launch(self._take_index()) for _ in range(self.cfg.reward.workers)]

    def start(self, launched: list[tuple[str, Path, Service]] | None = None) -> list[str]:
        """Start ``reward.workers`` workers (or take those ``launch`` started), wait until each
        answers, write the membership file; return their addresses."""
        started = self.launch() if launched is None else launched  # all start at once, then wait for each
        members = [(self._await(name, port_file, svc), svc) for name, port_file, svc in started]
        with self._lock:
            self.members = members
        self._publish()
        self._log({"event": "start", "workers": self.addresses})
        return self.addresses

    def pool(self) -> RewardPool:
        """A client pool following this controller's membership file, with the config's timeout and retries."""
        return RewardPool.from_config(self.cfg.reward, membership=self.membership)

    # ------------------------------------------------------------------ watcher side
    def poll(self) -> PoolDecision | None:
        """Sample the load, decide, start the action in the background. Raises a failed action.
        Returns the decision (None when scaling is off or this is the first sample)."""
        if self._error is not None:
            raise RuntimeError(f"reward pool action failed: {self._error}") from self._error
        if not self.cfg.reward.scaling.enabled:
            return None
        members = self.addresses
        sample = self._sample(self._clock(), members)
        if sample is None:
            return None
        self.history.append(sample)
        horizon = sample.t_s - 4 * (self.limits.window_s + self.limits.cooldown_s)
        self.history = [s for s in self.history if s.t_s >= horizon]
        decision = decide(self.history, len(members), self.limits, self.last_change_s)
        if self._busy is not None and self._busy.is_alive():
            decision = replace(decision, action="hold", workers=len(members), reason="a change is in progress")
        if decision.action == "hold" and sample.t_s - self._last_hold_logged < HOLD_LOG_EVERY_S:
            return decision  # one 'hold' line per HOLD_LOG_EVERY_S, every change logged
        if decision.action == "hold":
            self._last_hold_logged = sample.t_s
        self._log({"event": "decision", "workers": len(members), "reporting": sample.reporting,
                   "utilisation": sample.busy_s / sample.capacity_s if sample.capacity_s else None,
                   "queued": sample.queued, "window_utilisation": decision.utilisation,
                   "action": decision.action, "reason": decision.reason})
        if decision.action != "hold":
            self._busy = threading.Thread(target=contextvars.copy_context().run, args=(self._act, decision.action),
                                          name="reward-scaling", daemon=True)
            self._busy.start()
        return decision

    def wait(self, timeout_s: float = 120.0) -> None:
        """Let an action in progress finish; raise if it failed."""
        if self._busy is not None:
            self._busy.join(timeout_s)
        if self._error is not None:
            raise RuntimeError(f"reward pool action failed: {self._error}") from self._error

    def close(self) -> None:
        """Let an action in progress finish and close the Health channels (the Supervisor stops the processes)."""
        if self._busy is not None:
            self._busy.join(STOP_TIMEOUT_S + self.cfg.reward.timeout_s)
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def _sample(self, now: float, members: list[str]) -> LoadSample | None:
        healths = {a: h for a in members if (h := self._health(a)) is not None}
        previous, self._last = self._last, (now, {a: h.busy_s for a, h in healths.items()})
        if previous is None or now <= previous[0]:
            return None
        before = previous[1]
        deltas = [h.busy_s - before[a] for a, h in healths.items()
                  if a in before and h.busy_s >= before[a]]  # restarted: left out
        return LoadSample(now, now - previous[0], len(members), len(deltas), self.cfg.reward.threads, sum(deltas),
                          sum(h.queued for h in healths.values()))

    def _health(self, address: str) -> WorkerHealth | None:
        client = self._clients.get(address)
        if client is None:
            client = self._clients[address] = RewardClient(address)
        try:
            return client.health(timeout_s=HEALTH_TIMEOUT_S)
        except RewardError as err:  # a dead or restarting worker: left out of this sample
            log.info("reward worker %s did not answer Health: %s", address, err)
            return None

    # ------------------------------------------------------------------ action thread
    def _act(self, action: str) -> None:
        try:
            if action == "out":
                self._scale_out()
            else:
                self._scale_in()
        except BaseException as exc:  # noqa: BLE001 - surfaced by the next poll()
            self._error = exc
            return
        self.last_change_s = self._clock()

    def _scale_out(self) -> None:
        t0 = self._clock()
        address, svc = self._start_worker(self._take_index())
        with self._lock:
            self.members.append((address, svc))
        self._publish()
        self._log({"event": "scale_out", "address": address, "name": svc.name, "workers": len(self.addresses),
                   "start_s": self._clock() - t0})
        log.info("reward pool scale-out: %s (%s) joined (%d workers)", svc.name, address, len(self.addresses))

    def _scale_in(self) -> None:
        t0 = self._clock()
        with self._lock:
            address, svc = self.members.pop()  # the newest worker leaves first
        self._publish()
        time.sleep(DRAIN_SETTLE_S)
        deadline = time.monotonic() + self.cfg.reward.timeout_s + STOP_TIMEOUT_S
        while (h := self._health(address)) is not None and h.in_flight > 0:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{svc.name} ({address}) still had {h.in_flight} requests in flight after leaving the pool"
                )
            time.sleep(0.05)
        drained = self._clock() - t0
        self._stop(svc)
        client = self._clients.pop(address, None)
        if client is not None:
            client.close()
        self._log({"event": "scale_in", "address": address, "name": svc.name, "workers": len(self.addresses),
                   "served": h.served if h is not None else None, "drain_s": drained,
                   "stop_s": self._clock() - t0 - drained})
        log.info("reward pool scale-in: %s (%s) left (%d workers)", svc.name, address, len(self.addresses))

    # ------------------------------------------------------------------ processes
    def _take_index(self) -> int:
        with self._lock:
            index, self._next_index = self._next_index, self._next_index + 1
        return index

    def _launch(self, index: int, port: int = 0) -> tuple[str, Path, Service]:
        name = f"reward-{index}"
        port_file = self.run_dir / f"{name}.port"
        port_file.unlink(missing_ok=True)
        port = self.sup.ports.hold(self.host, port)
        args = ["--config", str(self.config), "--host", self.host, "--port", str(port), "--port-file", str(port_file),
                "--worker-id", name]
        return name, port_file, self.sup.start(name, "services.reward", args, threads=1)

    def _await(self, name: str, port_file: Path, svc: Service) -> str:
        """Wait until the worker wrote its port file and answers Health; mark it restartable on that port."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not port_file.exists():
            if svc.proc.poll() is not None:
                raise RuntimeError(f"reward worker {svc.describe_exit()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} did not write {port_file} within {READY_TIMEOUT_S}s:\n{tail(svc.log_path)}")
            time.sleep(0.05)
        port = int(port_file.read_text())
        address = f"{self.host}:{port}"
        with RewardClient(address) as client:
            client.wait_ready()
        index = int(name.rsplit("-", 1)[1])
        self.sup.restartable(name, lambda: self._restart(index, port))  # same port: the membership stays valid
        return address

    def _start_worker(self, index: int, port: int = 0) -> tuple[str, Service]:
        name, port_file, svc = self._launch(index, port)
        return self._await(name, port_file, svc), svc

    def _restart(self, index: int, port: int) -> None:
        """Called by ``Supervisor.check`` for a dead worker: start it again on its port."""
        address, svc = self._start_worker(index, port)
        with self._lock:
            self.members = [(a, svc if a == address else s) for a, s in self.members]

    def _stop(self, svc: Service) -> None:
        svc.restart = None  # it leaves for good: check() must not start it again
        svc.expect_exit = True
        svc.proc.terminate()
        try:
            svc.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            svc.proc.kill()
            svc.proc.wait()
        if svc in self.sup.services:
            self.sup.services.remove(svc)

    def _publish(self) -> None:
        with self._lock:
            self.version += 1
            version, workers = self.version, [a for a, _ in self.members]
        write_membership(self.membership, version, workers)
        self._log({"event": "membership", "version": version, "workers": workers})

    def _log(self, row: dict) -> None:
        with self._log_lock, self.events_path.open("a") as f:
            f.write(json.dumps({"t": time.time(), **row}) + "\n")
