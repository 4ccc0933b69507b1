"""The orchestrator's snapshots and repack migrations (mechanism around
``services.rollout.repack_policy``).

Every ``trainer.repack.interval_s`` (and right after each optimizer step) the orchestrator takes a
snapshot of every live SGS instance through its Health RPC: KV-cache use, running and queued
samples, installed version. The snapshots feed the KV-utilisation metric always, and, with
``trainer.repack.enabled``, the repack plan. A ``Migrate(source, destination)`` becomes:

1. **Interrupt** — the source's open calls are interrupted by request tag (``Interrupt`` RPC);
   each trajectory comes back on its stream with its tokens so far and goes to the resume list
   (the partial-response pool keeps its ``V_traj``, its reserved staleness entry is untouched);
2. **Route** — the orchestrator resumes it on the planned destination (same installed version, so
   never older than ``V_traj``); if the destination is gone or behind, on any routable instance;
3. **Pull** — the freed source has nothing in flight, so the sync policy offers it the newest
   weights on the next pass. Without partial rollout, repack syncs instances only when idle
   (``routing.instances_to_sync(idle_only=True)``, Laminar's pull on completion): a version
   staged on a busy instance would pause its admission, and with it the tails sent there.

Migrations in transit count in the destination's load (so new groups do not take the room the
plan gave them) and keep both instances out of the next plan (StaleFlow's speculative state).
Every trajectory the pool places on the source is a candidate of the move, but only one that comes
back interrupted (``interrupted``) is in transit to the destination's load: the pool lags the
engine by the samples still on their way to the orchestrator, which finished on the source and
never move (a 16-instance emulated run, 2026-11-30, sent 973 candidates and resumed 52; counted as
incoming they put up to 180 samples on one destination's load and kept new groups off it).
The overhead of a migration is the time from the Interrupt to the resume's launch.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from services.rollout.repack_policy import InstanceSnapshot, Migrate, RepackCoordinator, RepackSettings

log = logging.getLogger("braid.repack")


def health_of(clients, indices: list[int], on_lost: Callable[[int, str], None]) -> dict:
    """Health of each instance in ``indices`` (a ``HealthSnapshot`` by index); one that does not
    answer (UNAVAILABLE, deadline) is reported to ``on_lost`` and left out. The snapshots both
    repack and StaleFlow's coordination plan on."""
    out = {}
    for i in indices:
        try:
            out[i] = clients[i].health()
        except grpc.RpcError as err:
            if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                on_lost(i, f"Health: {err.details()}")
    return out


@dataclass
class _Move:
    source: int
    destination: int
    issued: float  # time.time() of the Interrupt
    interrupted: bool = False  # came back interrupted (else it may still finish on the source)


@dataclass
class Repacker:
    """Snapshots, plans and in-transit migrations of one bounded run."""

    enabled: bool
    coordinator: RepackCoordinator
    moving: dict[str, _Move] = field(default_factory=dict)  # partial key -> its migration
    kv_means: list[float] = field(default_factory=list)  # mean KV use over live instances, per snapshot
    overheads: list[float] = field(default_factory=list)  # Interrupt -> resume launch, seconds
    counts: Counter = field(default_factory=Counter)
    # told the samples in transit to each destination whenever they change (the fleet's ``set_incoming``)
    on_change: Callable[[Counter], None] | None = None

    @classmethod
    def from_config(cls, cfg) -> Repacker:
        settings = RepackSettings(c_max=cfg.c_max, batch_bound=cfg.batch_bound, interval_s=cfg.interval_s)
        return cls(cfg.enabled, RepackCoordinator(settings))

    # ------------------------------------------------------------------ snapshots and plans
    def in_transit(self) -> Counter:
        c: Counter = Counter()
        for m in self.moving.values():
            c[m.source] += 1
            c[m.destination] += 1
        return c

    def incoming(self) -> Counter:
        """Samples on their way to each destination: those interrupted and not yet resumed."""
        return Counter(m.destination for m in self.moving.values() if m.interrupted)

    def snapshot(self, clients, alive: list[bool], on_lost) -> list[InstanceSnapshot]:
        """Health of every live instance; an instance that does not answer (UNAVAILABLE) is lost."""
        transit = self.in_transit()
        out = [InstanceSnapshot(i, h.weight_version, h.kv_usage, h.running, h.waiting, True, transit[i],
                                draining=h.pending_version >= 0)
               for i, h in health_of(clients, [i for i in range(len(clients)) if alive[i]], on_lost).items()]
        if out:
            self.kv_means.append(sum(s.kv_used for s in out) / len(out))
        return out

    def check(self, clients, alive: list[bool], on_lost, force: bool = False) -> list[Migrate]:
        """Snapshot when due; the migrations to carry out (none when repack is off)."""
        if not self.coordinator.due(force):
            return []
        snaps = self.snapshot(clients, alive, on_lost)
        plan = self.coordinator.plan(snaps)
        return plan if self.enabled else []

    # ------------------------------------------------------------------ migrations
    def start(self, m: Migrate, keys: list[str], tags: list[str], client) -> None:
        """Interrupt the source's calls (``tags``); their trajectories (``keys``) go to the destination."""
        if not keys or not tags:
            return
        now = time.time()
        for k in keys:
            self.moving[k] = _Move(m.source, m.destination, now)
        self._changed()
        n = client.interrupt(tags)
        self.counts["repacks"] += 1
        self.counts["migration_candidates"] += len(keys)
        self.counts["migrations_sent"] += n
        log.info("repack: instance %d -> %d (version %d, %d trajectories, %d interrupted, kv %.2f)",
                 m.source, m.destination, m.version, len(keys), n, m.kv_used)

    def interrupted(self, key: str) -> None:
        """The trajectory came back interrupted: from now on it counts in its destination's load."""
        m = self.moving.get(key)
        if m is not None and not m.interrupted:
            m.interrupted = True
            self._changed()

    def destination(self, key: str) -> int | None:
        m = self.moving.get(key)
        return None if m is None else m.destination

    def launched(self, key: str, instance: int) -> None:
        """The trajectory resumed on ``instance``: its migration ends (overhead recorded)."""
        m = self.moving.pop(key, None)
        if m is not None:
            self._changed()
            self.overheads.append(time.time() - m.issued)
            self.counts["migrated" if instance == m.destination else "migrated_elsewhere"] += 1

    def forget(self, key: str) -> None:
        """The trajectory's group ended (complete, aborted) before it resumed."""
        if self.moving.pop(key, None) is not None:
            self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self.incoming())

    def metrics(self) -> dict:
        """Per iteration: mean KV use of the snapshots and the migration overheads (then reset);
        repack counts are run totals, as the orchestrator's other counts."""
        out = {"kv_usage_mean": sum(self.kv_means) / len(self.kv_means) if self.kv_means else None,
               "kv_snapshots": len(self.kv_means), **dict(self.counts)}
        if self.overheads:
            out["repack_overhead_s_mean"] = sum(self.overheads) / len(self.overheads)
            out["repack_overhead_s_max"] = max(self.overheads)
        self.kv_means, self.overheads = [], []
        return out
