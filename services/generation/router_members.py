"""The instances behind the SGS router: their rows on a ``Fleet``, their connections, and the
router's own membership changes (docs/fleet.md; scale-out: docs/scaleout.md).

One row per instance (``services.rollout.fleet``), its index the instance's slot: never reused, so
in-flight calls keep it; ``clients[i]`` is row ``i``'s connection, added with the row. The
dispatcher (``router.RouterCore``) books and releases sequences on the rows; this module changes
their membership:

- ``add_instance``: ``join`` claims the address (a row that takes no work), the caller's
  ``bring_up`` gives the instance the current weights and marks it live at that version
  (``mark_live``); a failed bring-up drains and removes the row, freeing the address;
- ``remove_instance``: ``drain`` (no new work), ``wait_drained`` (every sequence it holds
  returns: nothing is lost or re-run), ``remove``; refused for the last instance routed to and for
  the last of a pool that ``generation.affinity`` routes tasks to;
- ``lost``: a call failing UNAVAILABLE marks its live instance lost (load and work zeroed; samples
  other calls return late release nothing); it stays routed to (``Health``, weight versions) and
  ``staged`` makes it live again once a weight version fanned out through the router reached it.

Each change checks rows on a snapshot and then changes them; ``_changes`` keeps those steps one
at a time (two removals cannot both pass the last-instance check; a readmission cannot revive a
row that is being removed). Dispatch never takes it: a booking re-checks on the table itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import grpc

from services.common.config import GenerationConfig
from services.common.types import HealthSnapshot
from services.generation.client import GenerationClient
from services.generation.scheduling.pools import last_of_routed_pool, pool_of_instance, routed_tasks
from services.rollout.fleet import Fleet, FleetError, FleetSnapshot, Instance, State

log = logging.getLogger("braid.router")

BringUp = Callable[[GenerationClient, Callable[[int], None]], int]  # (client, join(version)) -> version
ROUTED: tuple[State, ...] = ("live", "lost")  # the instances routed to (a lost one comes back with a version)


class MembershipError(ValueError):
    """A refused membership change; ``code`` names the gRPC status the edge answers with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class RouterMembers:
    """The router's instances (see the module docstring). Thread-safe."""

    def __init__(self, clients: Sequence[GenerationClient], cfg: GenerationConfig,
                 log_event: Callable[[dict], None]) -> None:
        self.cfg = cfg
        self.log_event = log_event  # the router's timeline
        # a row's capacity is what its instance runs at once; the router books beyond it (the instance queues)
        self.fleet = Fleet(cfg.max_inflight)
        self.clients: list[GenerationClient] = []  # clients[i] is row i's connection
        self._changes = threading.Lock()
        for client in clients:
            self._join(client, live=True)

    # ------------------------------------------------------------------ reads
    def addresses(self) -> list[str]:
        """The instances routed to (live, and lost ones a weight version brings back), in slot order."""
        return [r.address for r in self.fleet.snapshot().rows if r.state in ROUTED]

    def weight_clients(self) -> list[GenerationClient]:
        """The instances a new weight version goes to: those routed to and the draining ones still
        finishing work (a draining instance may hold a request that waits for this very version;
        leaving it out would leave that request, and the drain, waiting forever)."""
        rows = self.fleet.snapshot().rows
        return [self.clients[r.index] for r in rows if r.state in ROUTED or (r.state == "draining" and r.inflight)]

    def health(self) -> HealthSnapshot:
        """The instances routed to, aggregated (raises ``grpc.RpcError`` when one does not answer)."""
        snaps = [self.clients[i].health() for i in self.fleet.snapshot().in_state(*ROUTED)]
        return HealthSnapshot(
            status="draining" if any(s.status == "draining" for s in snaps) else "serving",
            weight_version=min(s.weight_version for s in snaps),
            pending_version=max(s.pending_version for s in snaps),
            running=sum(s.running for s in snaps),
            waiting=sum(s.waiting for s in snaps),
            finished=sum(s.finished for s in snaps),
            kv_usage=sum(s.kv_usage for s in snaps) / len(snaps),
            engine=f"router[{len(snaps)} x {snaps[0].engine}]",
            generated_tokens=sum(s.generated_tokens for s in snaps),
        )

    # ------------------------------------------------------------------ joins and removals
    def _join(self, client: GenerationClient, *, live: bool) -> int:
        """A row for ``client`` (live, or joining: no work until ``mark_live``) and its connection at
        the same index. Raises ``FleetError`` for an address a row still holds."""
        with self._changes:
            i = len(self.clients)
            self.clients.append(client)
            try:  # an instance added at run time (i >= generation.instances) is in the scale-out pool
                joined = self.fleet.join(client.address, live=live, pool=pool_of_instance(i, self.cfg))
            except FleetError:
                self.clients.pop()
                raise
            assert joined == i, (joined, i)
            return i

    def add_instance(self, client: GenerationClient, bring_up: BringUp) -> int:
        """Route to ``client`` from now on. ``bring_up(client, join)`` gives it the current weights and
        calls ``join(version)`` (its row goes live at that version) while no newer version can be
        fanned out; returns the version it reported. Raises ``MembershipError`` for an address that
        still has a row (routed to, joining or leaving)."""
        try:
            i = self._join(client, live=False)
        except FleetError as err:
            raise MembershipError(grpc.StatusCode.ALREADY_EXISTS,
                                  f"instance {client.address} is already routed to ({err})") from None
        try:
            version = bring_up(client, lambda v: self.fleet.mark_live(i, v))
        finally:
            joined = self.fleet.snapshot()[i].state != "joining"
            if not joined:  # its address is free again; the row stays (slots are never reused)
                self.fleet.drain(i)
                self.fleet.remove(i)
        if not joined:
            raise RuntimeError(f"bring-up of {client.address} returned without joining it")
        self.log_event({"event": "add_instance", "t": time.time(), "slot": i, "address": client.address,
                        "pool": pool_of_instance(i, self.cfg), "weight_version": version,
                        "instances": self.addresses()})
        return version

    def remove_instance(self, address: str, timeout_s: float) -> int:
        """Stop giving ``address`` new work and wait until it returned its in-flight sequences; return
        how many it held. Raises ``MembershipError`` (unknown, last instance, or still busy after
        ``timeout_s``: it stays draining, its work still completes, the removal may be retried)."""
        with self._changes:
            row = self._leaving(self.fleet.snapshot(), address)
            held = self.fleet.drain(row.index) if row.state == "live" else row.inflight
            if row.state == "lost":  # it holds nothing: removed now, before a version could take it back
                self.fleet.remove(row.index)
            t_removed = time.time()  # after the drain: a dispatch logged later was planned without it
        self.log_event({"event": "remove_instance", "t": t_removed, "slot": row.index, "address": address,
                        "in_flight": held})
        if not self.fleet.wait_drained(row.index, timeout_s):
            raise MembershipError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                  f"{address} still holds {self.fleet.snapshot()[row.index].inflight} sequences "
                                  f"after {timeout_s:.0f}s; it receives no new work and its in-flight work still "
                                  "completes")
        with self._changes:
            if self.fleet.snapshot()[row.index].state != "removed":  # lost, or a retried removal finished it
                self.fleet.remove(row.index)
        return held

    def _leaving(self, snap: FleetSnapshot, address: str) -> Instance:
        """The row ``address`` leaves from (a draining one: a removal retried). Raises
        ``MembershipError``: not routed to, the last instance, the last of a pool affinity routes to."""
        routed = snap.in_state(*ROUTED)
        row = snap.by_address(address)
        if row is not None and row.state == "draining":
            return row
        if row is None or row.state not in ROUTED:
            raise MembershipError(grpc.StatusCode.NOT_FOUND, f"no routed instance at {address} (instances: "
                                  f"{[snap[i].address for i in routed]})")
        if len(routed) == 1:
            raise MembershipError(grpc.StatusCode.FAILED_PRECONDITION,
                                  f"{address} is the last instance; add another first")
        if (pool := last_of_routed_pool(row.index, self.cfg, routed)) is not None:
            raise MembershipError(grpc.StatusCode.FAILED_PRECONDITION,
                                  f"{address} is the last instance of pool {pool!r}, which generation.affinity "
                                  f"routes tasks {routed_tasks(pool, self.cfg)} to; add another first")
        return row

    # ------------------------------------------------------------------ losses and readmission
    def lost(self, i: int, epoch: int, why: str) -> None:
        """A call to instance ``i`` booked in incarnation ``epoch`` failed UNAVAILABLE: lost, unless it
        was lost since or is leaving (its removal waits for its calls, which release what they hold)."""
        with self._changes:
            if self.fleet.snapshot()[i].state == "live" and self.fleet.mark_lost(i, why, epoch=epoch):
                log.warning("instance %d (%s) lost: %s", i, self.clients[i].address, why)

    def staged(self, clients: Sequence[GenerationClient], version: int) -> list[int]:
        """A weight version fanned out through the router reached ``clients`` (each acknowledged it):
        a lost one among them is live again at ``version`` (a new incarnation), the others record
        it. Returns the slots taken back."""
        back: list[int] = []
        with self._changes:
            snap = self.fleet.snapshot()
            for row in filter(None, (snap.by_address(c.address) for c in clients)):
                if row.state == "lost":
                    self.fleet.mark_live(row.index, version)
                    log.info("instance %d (%s) taken back at weight version %d", row.index, row.address, version)
                    back.append(row.index)
                else:
                    self.fleet.record_version(row.index, version, staged=True)
        return back
