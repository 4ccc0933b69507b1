"""Staleness-aware routing and weight synchronisation of rollout instances (pure policy).

StaleFlow §5.3 / Appendix D, reduced to what Braid's instances need:

- ``check_routable`` is Algorithm 2: a new trajectory (no ``V_traj`` yet) may go to an
  instance if the staleness manager could reserve it at the instance's version; a resumed or
  migrated trajectory (``V_traj`` fixed) only to an instance whose version is not older.
- ``pick_instance``: among routable instances with spare capacity, the oldest version first
  (StaleFlow's routing groups candidates by ascending version: older instances spend their
  remaining staleness budget before it expires), then the least loaded; optionally only
  among the instances of the trajectory's pool (RollArt's hardware affinity:
  ``services.generation.scheduling.pools.eligible_instances``).
- ``instances_to_sync``: *lazy* synchronisation. An instance takes the newest weights only
  when it is idle, or — with partial rollout only — as soon as it can no longer start
  trajectories at its version (the bound forbids it). Each sync costs a drain (or, with partial
  rollout, an interrupt and re-prefill), so syncing only when needed keeps instances busy; the
  bound keeps the data fresh enough.
  Without partial rollout (``pull_on_completion``) an instance takes new weights only when
  idle, as Laminar's rollouts pull on completion: a staged version pauses admission, so staging
  it while the instance still runs a tail makes the instance look ready at the new version and
  draws the next step's groups into its queue, behind the drain; left at its version, it gets
  none of them while another instance that has drained takes them (in one-step runs the instances
  take turns: one starts step k+1 while the other finishes step k's tail), and a repack's
  migrated tails are not blocked there either. The repack is what frees a blocked instance.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class InstanceView:
    index: int
    version: int  # the version new work on this instance runs with (offered weights)
    inflight: int  # samples running or queued there
    capacity: int  # most samples in flight
    alive: bool = True


CanReserve = Callable[[int], bool]


def check_routable(v_traj: int | None, inst: InstanceView, can_reserve: CanReserve) -> bool:
    if v_traj is None:
        return can_reserve(inst.version)
    return inst.version >= v_traj


def pick_instance(
    v_traj: int | None, instances: list[InstanceView], can_reserve: CanReserve, need: int = 1,
    eligible: Collection[int] | None = None, prefer: int | None = None, slack: int = 0,
) -> InstanceView | None:
    """The instance to run a trajectory (or a group of ``need`` samples) on, or None.
    ``eligible``: the instance indices the trajectory's task may use (hardware affinity,
    ``scheduling.pools.eligible_instances``); None = any. ``prefer``: the instance that served the
    trajectory's previous turn (its prefix is cached there), kept unless it is busier than the
    choice by more than ``slack`` samples."""
    candidates = [
        i for i in instances
        if (eligible is None or i.index in eligible)
        and i.alive and i.inflight + need <= i.capacity and check_routable(v_traj, i, can_reserve)
    ]
    best = min(candidates, key=lambda i: (i.version, i.inflight, i.index), default=None)
    sticky = next((i for i in candidates if i.index == prefer), None)
    if best is not None and sticky is not None and sticky.inflight <= best.inflight + slack:
        return sticky
    return best


def pull_on_completion(partial_rollout: bool) -> bool:
    """Whether instances take new weights only when idle (``instances_to_sync(idle_only=...)``):
    always, unless partial rollout interrupts running trajectories to install them at once."""
    return not partial_rollout


def instances_to_sync(
    instances: list[InstanceView], newest: int, can_reserve: CanReserve, idle_only: bool = False
) -> list[int]:
    """Indices of instances that should take version ``newest`` now (lazy synchronisation)."""
    return [
        i.index for i in instances
        if i.alive and i.version < newest and (i.inflight == 0 or (not idle_only and not can_reserve(i.version)))
    ]


class InstanceRouter:
    """The one place that picks an SGS instance, for every workflow: a single-turn group, a resumed
    or migrated trajectory, a multi-turn trajectory's next turn, an evaluation share. It keeps what
    the picks need — samples in flight per instance, which instances are alive — and asks
    ``pick_instance`` (staleness-aware, capacity, affinity, stickiness). ``versions()``: the version
    new work on each instance runs with (the weights offered to it); ``incoming()``: samples on
    their way to each, by instance index (repack migrations: the repacker's ``Counter``), counted in
    its load. Thread-safe: a multi-turn run picks from its event loop's thread."""

    def __init__(self, n: int, capacity: int, versions: Callable[[], list[int]],
                 incoming: Callable[[], Mapping[int, int]] | None = None) -> None:
        self.capacity = capacity
        self.versions, self.incoming = versions, incoming
        self.inflight = [0] * n
        self.alive = [True] * n
        self.open = [True] * n  # takes new work (False: leaving the run, its work still completes)
        self.placed = [0] * n  # picks counted by ``acquire`` (multi-turn turns, evaluation shares)
        self.losses = 0  # times an instance was lost
        self._lock = threading.RLock()  # ``acquire`` picks (``views``) under it

    def views(self) -> list[InstanceView]:
        """One view per instance that both the router and ``versions()`` know: a joining instance's
        weights publisher may list it before ``add`` gives it a slot here (another thread picks
        meanwhile), and an instance without a slot is not routable yet."""
        extra = self.incoming() if self.incoming is not None else {}
        with self._lock:
            versions = self.versions()
            return [InstanceView(i, versions[i], self.inflight[i] + extra.get(i, 0), self.capacity,
                                 self.alive[i] and self.open[i])
                    for i in range(min(len(versions), len(self.inflight)))]

    def pick(self, v_traj: int | None, can_reserve: CanReserve, need: int = 1, eligible: Collection[int] | None = None,
             prefer: int | None = None, slack: int = 0) -> InstanceView | None:
        return pick_instance(v_traj, self.views(), can_reserve, need, eligible, prefer, slack)

    def acquire(self, v_traj: int | None, can_reserve: CanReserve, need: int = 1,
                eligible: Collection[int] | None = None, prefer: int | None = None,
                slack: int = 0) -> InstanceView | None:
        """``pick`` and count ``need`` samples on its choice, atomically (concurrent pickers)."""
        with self._lock:
            inst = self.pick(v_traj, can_reserve, need, eligible, prefer, slack)
            if inst is not None:
                self.inflight[inst.index] += need
                self.placed[inst.index] += 1
            return inst

    def started(self, i: int, n: int) -> None:
        with self._lock:
            self.inflight[i] += n

    def returned(self, i: int, n: int = 1) -> None:
        with self._lock:
            self.inflight[i] -= n

    def lose(self, i: int) -> None:
        """Instance ``i`` is gone: nothing runs there any more."""
        with self._lock:
            self.losses += int(self.alive[i])
            self.alive[i] = False
            self.inflight[i] = 0

    def readmit(self, i: int) -> None:
        """Instance ``i`` is back (restarted, at the newest weights): routable again, nothing in flight."""
        with self._lock:
            self.alive[i] = True
            self.inflight[i] = 0

    def live(self) -> list[int]:
        """The instances that take new work."""
        return [i for i, ok in enumerate(self.alive) if ok and self.open[i]]

    def add(self, alive: bool = False) -> int:
        """A new slot (a joining instance: not routable until ``readmit``); its index."""
        with self._lock:
            self.inflight.append(0)
            self.placed.append(0)
            self.alive.append(alive)
            self.open.append(True)
            return len(self.alive) - 1

    def close(self, i: int) -> None:
        """Instance ``i`` leaves: no new work; what it holds still completes."""
        with self._lock:
            self.open[i] = False
