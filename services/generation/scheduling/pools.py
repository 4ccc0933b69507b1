"""Task affinity: which instances may generate a sequence, by its task's pool (pure, no I/O).

RollArt §4.1 P1 (hardware-affinity workload mapping) at the trajectory level: prefill-heavy
tasks (many turns, e.g. FrozenLake, SWE) run best on compute-dense GPUs (H800), decode-heavy
ones (few turns, long reasoning, e.g. GEM-math) on bandwidth-rich ones (H20) (§3.1, Fig. 4).
``generation.pools`` name disjoint sets of instances, ``generation.affinity`` maps each task tag
(``PromptSpec.task``) to a pool, ``default`` standing for tasks not listed
(``services.common.pool_config``).

- ``eligible_instances(task, gen, open_slots)``: the open instances a sequence of ``task`` may
  run on. Used by the SGS router (``split_by_pool``: the configured dispatch policy runs once per
  pool over that pool's instances, ``merge_plans`` joins the plans) and usable by a coordinator
  that talks to instances directly (bounded mode: ``services.rollout.routing.pick_instance``'s
  ``eligible`` filter).
- Instance indices are the router's slots: slot ``i < generation.instances`` is configured
  instance ``i``; later slots (instances added at run time) belong to
  ``generation.scaleout_pool`` (default: the first pool).
- A task with no pool (affinity set, the task not listed, no ``default``) or whose pool has no
  open instance raises ``AffinityError``: the router answers FAILED_PRECONDITION naming the task
  and the pool. There is no spill-over to other pools (RollArt routes "with high priority",
  i.e. may spill): a sequence generated on the wrong hardware is silently slower, and a pool
  cannot become empty through the router (``last_of_routed_pool``: it refuses to remove the last
  instance of a pool that affinity routes to).

Without affinity (the default) every open instance is eligible and nothing changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from services.common.config import GenerationConfig
from services.common.pool_config import DEFAULT_TASK
from services.generation.scheduling.types import DispatchPlan


class AffinityError(ValueError):
    """No instance may generate a task's sequences: the task has no pool, or its pool no open instance."""


def pool_of_task(task: str, gen: GenerationConfig) -> str | None:
    """The pool that generates ``task``'s sequences; None = any instance (no affinity configured).
    Raises ``AffinityError`` when affinity is configured but lists neither ``task`` nor ``default``."""
    if not gen.affinity:
        return None
    pool = gen.affinity.get(task, gen.affinity.get(DEFAULT_TASK))
    if pool is None:
        raise AffinityError(f"task {task!r} has no pool: generation.affinity lists {sorted(gen.affinity)} "
                            f"and no {DEFAULT_TASK!r} entry")
    return pool


def pool_of_instance(index: int, gen: GenerationConfig) -> str | None:
    """The pool of instance (router slot) ``index``; instances added at run time (index >=
    ``generation.instances``) are in ``scaleout_pool`` (default the first pool). None without pools."""
    if not gen.pools:
        return None
    if index >= gen.instances:
        return gen.scaleout_pool or gen.pools[0].name
    return next(p.name for p in gen.pools if index in p.instances)


def hardware_of_pool(pool: str | None, gen: GenerationConfig) -> str | None:
    """The ``hardware`` label of pool ``pool`` (None for no pool)."""
    return next((p.hardware for p in gen.pools if p.name == pool), None)


def eligible_instances(task: str, gen: GenerationConfig, open_slots: Sequence[int]) -> list[int]:
    """The open slots (in ``open_slots`` order) that may generate a sequence of ``task``.
    Raises ``AffinityError`` naming the task and pool when there is none."""
    pool = pool_of_task(task, gen)
    if pool is None:
        if not open_slots:
            raise AffinityError(f"task {task!r}: no open instance")
        return list(open_slots)
    members = [i for i in open_slots if pool_of_instance(i, gen) == pool]
    if not members:
        raise AffinityError(f"task {task!r} maps to pool {pool!r}, which has no open instance "
                            f"(open instances: {list(open_slots)})")
    return members


@dataclass(frozen=True)
class PoolShare:
    """The sequences of one request that one pool generates."""

    pool: str | None  # None: no affinity configured (every open instance)
    tasks: tuple[str, ...]  # the task tags routed here, sorted
    slots: tuple[int, ...]  # the pool's open instances; a dispatch plan's index k is slots[k]
    members: tuple[int, ...]  # positions of its sequences in the request's sequence list


def split_by_pool(tasks: Sequence[str], gen: GenerationConfig, open_slots: Sequence[int]) -> list[PoolShare]:
    """Group a request's sequences (given by their task tags) by the pool that generates them,
    in order of first appearance; one share over every open slot without affinity. Raises
    ``AffinityError`` for the first task that has no eligible instance."""
    by_pool: dict[str | None, list[int]] = {}
    slots: dict[str | None, list[int]] = {}
    names: dict[str | None, set[str]] = {}
    eligible: dict[str, tuple[str | None, list[int]]] = {}
    for k, task in enumerate(tasks):
        if task not in eligible:
            eligible[task] = (pool_of_task(task, gen), eligible_instances(task, gen, open_slots))
        pool, members = eligible[task]
        by_pool.setdefault(pool, []).append(k)
        slots[pool] = members
        names.setdefault(pool, set()).add(task)
    return [PoolShare(pool, tuple(sorted(names[pool])), tuple(slots[pool]), tuple(ks)) for pool, ks in by_pool.items()]


def merge_plans(parts: Sequence[tuple[PoolShare, DispatchPlan]]) -> DispatchPlan:
    """One plan whose instance indices are slots, from per-pool plans numbered densely within
    their pool. With several pools the notes are prefixed ``<pool>.`` and the predicted makespan
    is the slowest pool's."""
    if not parts:
        raise ValueError("merge_plans needs at least one pool's plan")
    assignment: dict[str, int] = {}
    long_tail: set[str] = set()
    long_instances: list[int] = []
    notes: dict[str, float | int | str] = {}
    makespans = [p.predicted_makespan_s for _, p in parts if p.predicted_makespan_s is not None]
    for share, plan in parts:
        assignment.update({seq: share.slots[k] for seq, k in plan.assignment.items()})
        long_tail |= plan.long_tail
        long_instances += [share.slots[k] for k in plan.long_instances]
        notes.update(plan.notes if len(parts) == 1 else {f"{share.pool}.{k}": v for k, v in plan.notes.items()})
    return replace(parts[0][1], assignment=assignment, long_tail=frozenset(long_tail),
                   long_instances=tuple(long_instances), predicted_makespan_s=max(makespans) if makespans else None,
                   notes=notes)


def last_of_routed_pool(slot: int, gen: GenerationConfig, open_slots: Sequence[int]) -> str | None:
    """The pool of ``slot`` when it is that pool's last open instance and affinity routes tasks
    there (removing it would leave those tasks nowhere to run), else None."""
    pool = pool_of_instance(slot, gen)
    if pool is None or pool not in gen.affinity.values():
        return None
    others = [i for i in open_slots if i != slot and pool_of_instance(i, gen) == pool]
    return None if others else pool


def routed_tasks(pool: str, gen: GenerationConfig) -> list[str]:
    """The affinity keys that map to ``pool`` (``default`` included), sorted."""
    return sorted(t for t, p in gen.affinity.items() if p == pool)
