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
  when it can no longer start trajectories at its version (the bound forbids it) or when it
  is idle. Each sync costs a drain (or, with partial rollout, an interrupt and re-prefill), so
  syncing only when needed keeps instances busy; the bound keeps the data fresh enough.
  With ``idle_only`` (repack on, no partial rollout) an instance takes new weights only when
  idle, as Laminar's rollouts pull on completion: a staged version would pause admission and
  block the migrated tails a repack sends there; the repack is what frees a blocked instance.
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


CanReserve = Callable[[int], bool]


def check_routable(v_traj: int | None, inst: InstanceView, can_reserve: CanReserve) -> bool:
    if v_traj is None:
        return can_reserve(inst.version)
    return inst.version >= v_traj


def pick_instance(
    v_traj: int | None, instances: list[InstanceView], can_reserve: CanReserve, need: int = 1,
    eligible: Collection[int] | None = None,
) -> InstanceView | None:
    """The instance to run a trajectory (or a group of ``need`` samples) on, or None.
    ``eligible``: the instance indices the trajectory's task may use (hardware affinity,
    ``scheduling.pools.eligible_instances``); None = any."""
    candidates = [
        i for i in instances
        if (eligible is None or i.index in eligible)
        and i.alive and i.inflight + need <= i.capacity and check_routable(v_traj, i, can_reserve)
    ]
    return min(candidates, key=lambda i: (i.version, i.inflight, i.index), default=None)


def instances_to_sync(
    instances: list[InstanceView], newest: int, can_reserve: CanReserve, idle_only: bool = False
) -> list[int]:
    """Indices of instances that should take version ``newest`` now (lazy synchronisation)."""
    return [
        i.index for i in instances
        if i.alive and i.version < newest and (i.inflight == 0 or (not idle_only and not can_reserve(i.version)))
    ]
