"""Instance pools and task affinity of the SGS (RollArt §4.1 P1, hardware-affinity workload mapping).

``generation.pools`` names disjoint sets of SGS instances (indices ``0..generation.instances-1``)
and the hardware they run on; ``generation.affinity`` maps a prompt's task tag
(``PromptSpec.task``) to the pool whose instances generate it, ``default`` standing for every
task not listed. Both empty (the default): one implicit pool of every instance and no routing
constraint, as before pools existed. Pools without affinity only label instances (the router's
timeline records them); affinity without pools is refused.

Instances added at run time (``AddInstance``, dynamic scale-out) join ``generation.scaleout_pool``
(empty: the first pool). The routing itself is ``services.generation.scheduling.pools``
(docs/affinity.md). Whether a pool's ``hardware`` is a known kind is checked when a run is prepared
(``flows/registries.py``): this schema is data only.
"""

from __future__ import annotations

import re

from pydantic import Field, NonNegativeInt, field_validator

from services.common.strict import StrictModel

MAX_TASK_CHARS = 64  # a task tag is an environment kind ("calculator", "frozenlake"), not free text
TASK_CHARS = re.compile(r"[A-Za-z0-9_.:-]*")  # tags travel in timelines and config keys: no spaces, quotes or slashes
DEFAULT_TASK = "default"  # the affinity key for tasks not listed
CPU_HARDWARE = "cpu-local"  # this machine's CPU engine (no spec sheet: profiles are measured)


def task_problem(task: str) -> str | None:
    """Why ``task`` is not a valid task tag, or None: at most 64 characters of ``[A-Za-z0-9_.:-]``
    ("" = untagged)."""
    if len(task) > MAX_TASK_CHARS:
        return f"task tag must be at most {MAX_TASK_CHARS} characters, got {len(task)} ({task[:40]!r}...)"
    if not TASK_CHARS.fullmatch(task):
        return f"task tag may hold only letters, digits and _ . : -, got {task!r}"
    return None


class PoolConfig(StrictModel):
    """One named pool of SGS instances on one kind of hardware."""

    name: str = Field(
        min_length=1, max_length=MAX_TASK_CHARS, pattern=r"^[A-Za-z0-9_.:-]+$",
        description="Pool name (1..64 characters of letters, digits and _ . : -), referenced by generation.affinity.",
    )
    hardware: str = Field(
        CPU_HARDWARE,
        description="What the pool's instances run on: a GPU kind of services/generation/scheduling/hardware.py "
        "(H20, H800, H100) or 'cpu-local' (checked when a run is prepared, flows/registries.py). Recorded in the "
        "router timeline; `braid affinity` plans with it.",
    )
    instances: list[NonNegativeInt] = Field(
        min_length=1, max_length=64,
        description="Indices of the pool's SGS instances, each in [0, generation.instances) and in no other pool.",
    )

    @field_validator("instances")
    @classmethod
    def _distinct(cls, value: list[int]) -> list[int]:
        repeated = sorted({i for i in value if value.count(i) > 1})
        if repeated:
            raise ValueError(f"instances {repeated} are listed more than once")
        return value


def check_pools(pools: list[PoolConfig], affinity: dict[str, str], instances: int, scaleout_pool: str) -> None:
    """Raise ``ValueError`` naming the offending values unless the pools partition
    ``range(instances)`` under unique names and every affinity entry (and ``scaleout_pool``) names a pool."""
    if not pools:
        if affinity:
            raise ValueError(f"generation.affinity ({affinity}) needs generation.pools to name its pools")
        if scaleout_pool:
            raise ValueError(f"generation.scaleout_pool ({scaleout_pool!r}) needs generation.pools")
        return
    names = [p.name for p in pools]
    if len(set(names)) != len(names):
        raise ValueError(f"generation.pools: pool names must be unique, got {names}")
    owner: dict[int, str] = {}
    for p in pools:
        for i in p.instances:
            if i >= instances:
                raise ValueError(f"generation.pools: pool {p.name!r} lists instance {i}, outside [0, {instances}) "
                                 f"(generation.instances = {instances})")
            if i in owner:
                raise ValueError(f"generation.pools: instance {i} is in both pool {owner[i]!r} and pool {p.name!r}")
            owner[i] = p.name
    missing = [i for i in range(instances) if i not in owner]
    if missing:
        raise ValueError(f"generation.pools: instances {missing} are in no pool (every instance needs one)")
    for task, pool in affinity.items():
        if (why := task_problem(task)) is not None or not task:
            raise ValueError(f"generation.affinity: key {task!r}: {why or 'task tag must not be empty'}")
        if pool not in names:
            raise ValueError(f"generation.affinity: task {task!r} maps to pool {pool!r}, not one of {names}")
    if scaleout_pool and scaleout_pool not in names:
        raise ValueError(f"generation.scaleout_pool {scaleout_pool!r} is not one of the pools {names}")
