"""The chain controller: heartbeats, re-planning, master replacement (Laminar §4.3).

Mechanism around the pure ``chain`` policy, run by the process that coordinates rollouts (the
trainer; the benchmark in ``bench/weights.py``). Every ``heartbeat_s`` it calls each relay's
``Heartbeat`` with a short deadline. A relay that does not answer (its port refuses: a dead
process is seen at once; a hung one at the deadline) is cut out; one that answers again (a
restart) is put back. On any change it recomputes the plan (``plan_broadcast``) and sends every
live relay its branches with a new epoch (``SetChain``); a rejoining relay is given its upstream
so it catches up from that neighbour. Forwarders re-link on their own the moment a hop fails
(O(1), ``server._forward``); the controller's plan is what later versions follow.

If the master dies, ``choose_master`` promotes a live relay of the training site (else of any
site) and ``on_master(address)`` tells the trainer where to push from now on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import grpc

from services.common.certs import TlsFiles
from services.weights.chain import BroadcastPlan, RelayNode, choose_master, plan_broadcast
from services.weights.client import RelayClient, RelayError

log = logging.getLogger("braid.weights.controller")


class ChainController:
    def __init__(
        self, nodes: list[RelayNode], training_site: str, *, heartbeat_s: float = 0.2, timeout_s: float = 1.0,
        tls: TlsFiles | None = None, on_master: Callable[[str], None] | None = None,
    ) -> None:
        self.nodes = list(nodes)
        self.training_site = training_site
        self.heartbeat_s = heartbeat_s
        self.timeout_s = timeout_s
        self.on_master = on_master
        self.master: str | None = None
        self.plan: BroadcastPlan | None = None
        self.epoch = 0
        self.events: list[dict] = []  # {"time", "relay", "change", "replan_s"}
        self._tls = tls
        self._clients = {n.relay_id: self._client(n) for n in nodes}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _client(self, n: RelayNode) -> RelayClient:
        if n.site != self.training_site and n.remote_id.startswith("tls://"):
            return RelayClient(n.remote_id.removeprefix("tls://"), tls=self._tls)
        return RelayClient(n.relay_id)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> ChainController:
        self.tick(force=True)
        self._thread = threading.Thread(target=self._run, name="chain-controller", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for c in self._clients.values():
            c.close()

    def _run(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                self.tick()
            except Exception:  # a controller that dies silently would stop repairs: log and go on
                log.exception("chain controller tick failed")

    # ------------------------------------------------------------------ one round
    def tick(self, force: bool = False) -> bool:
        """Heartbeat every relay; re-plan on a change. Returns True when the plan changed."""
        with self._lock:
            t0 = time.monotonic()
            changed = []
            for i, n in enumerate(self.nodes):
                alive = self._beat(n)
                if alive != n.alive:
                    self.nodes[i] = RelayNode(n.relay_id, n.site, alive, n.remote_id)
                    changed.append((n.relay_id, "revived" if alive else "dead"))
            if not changed and not force:
                return False
            self._replan()
            for relay, change in changed:
                self.events.append({"time": time.time(), "relay": relay, "change": change,
                                    "replan_s": time.monotonic() - t0, "master": self.master})
                log.warning("relay %s %s; master %s, epoch %d", relay, change, self.master, self.epoch)
            return True

    def _beat(self, n: RelayNode) -> bool:
        try:
            self._clients[n.relay_id].heartbeat("controller", self.timeout_s)
            return True
        except grpc.RpcError as err:
            if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return False
            raise

    def _replan(self) -> None:
        master = choose_master(self.nodes, self.training_site, self.master)
        if master is None:
            self.plan = None
            log.error("no live relay left")
            return
        self.plan = plan_broadcast(self.nodes, master)
        self.epoch += 1
        by_id = {n.relay_id: n for n in self.nodes}
        seen = self.epoch
        for rid, branches in self.plan.branches.items():
            site = by_id[rid].site
            up = self.plan.upstream.get(rid, "")
            reachable = up and (by_id[up].site == site or by_id[up].remote_id)  # no address for it there: no catch-up
            try:
                seen = max(seen, self._clients[rid].set_chain(
                    self.epoch,
                    [[by_id[r].address_for(site) for r in b] for b in branches],
                    by_id[up].address_for(site) if reachable else "",
                ))
            except (grpc.RpcError, RelayError) as err:  # it died meanwhile: the next tick cuts it out
                log.warning("SetChain to %s failed: %s", rid, err)
        if seen > self.epoch:  # a controller before this one (a trainer that was restarted) got further
            self.epoch = seen
            self._replan()
            return
        if master != self.master:
            previous, self.master = self.master, master
            if previous is not None:
                log.warning("master relay %s replaced by %s", previous, master)
            if self.on_master is not None:
                self.on_master(by_id[master].relay_id)

    def clients(self) -> list[RelayClient]:
        """A client of every relay (live or not), for queries."""
        return list(self._clients.values())

    def live(self) -> list[str]:
        return [n.relay_id for n in self.nodes if n.alive]
