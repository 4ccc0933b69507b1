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

from collections.abc import Callable, Collection
from dataclasses import dataclass


@dataclass(frozen=True)
class InstanceView:
    index: int
    version: int  # the version new work on this instance runs with (offered weights)
    inflight: int  # samples running or queued there
    capacity: int  # most samples in flight
    alive: bool = True
    work: float = 0.0  # estimated output tokens outstanding there (the dispatch policies' load)


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
