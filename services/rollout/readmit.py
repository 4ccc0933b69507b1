"""Lost SGS instances come back (mechanism).

The launcher starts a dead instance again on its address (``flows.processes.start_instances``'
restart); meanwhile its trajectories resume elsewhere (``services.rollout.orchestrator``). Every
``interval_s`` the orchestrator asks each lost instance for its Health; one that answers gets a
fresh weight pusher and the newest published version, and is routable again once that version
is staged there (its engine never serves work on the weights it restarted with).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc


class Readmission:
    PROBE_TIMEOUT_S = 1.0

    def __init__(self, publisher, interval_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.publisher = publisher
        self.interval_s, self.clock = interval_s, clock
        self.pending: dict[int, int] = {}  # instance -> the version it must stage before it is routable
        self._probed: dict[int, float] = {}

    def poll(self, lost: list[int], latest: tuple[int, object]) -> list[int]:
        """The lost instances ready to serve again (each at version ``latest[0]``)."""
        version, snap = latest
        for i in lost:
            if i in self.pending or self.clock() - self._probed.get(i, -1e9) < self.interval_s:
                continue
            self._probed[i] = self.clock()
            try:
                self.publisher.clients[i].health(timeout_s=self.PROBE_TIMEOUT_S)
            except grpc.RpcError:
                continue  # not back yet
            pusher = self.publisher.renew(i)
            if snap is not None:  # None: the run's first weights, which the instance loaded at start
                pusher.offer(version, snap)
            self.pending[i] = version if snap is not None else -1
        ready = []
        for i, v in list(self.pending.items()):
            pusher = self.publisher.pushers[i]
            if pusher.error is not None:  # it went away again: probe it later
                del self.pending[i]
            elif pusher.published >= v:
                del self.pending[i]
                ready.append(i)
        return ready
