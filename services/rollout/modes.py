"""Pipeline modes as values of the staleness bound (pure).

The orchestrator has one path for every mode; a mode only sets eta, the bound every trained
trajectory satisfies (``V_traj + eta >= V_buf``, ``services.rollout.staleness``), and whether the
head buffer's gradients stream while it fills:

- ``sync``: eta 0. Every group of step k is generated with version k (on-policy); the trainer
  backwards complete groups while the rest still generate (StreamRL's dynamic-batch pipelining).
- ``sequential``: eta 0 with training held until the whole batch has been generated (the naive
  baseline).
- ``one_step``: eta 1. The next step's groups start before this step trains, with the weights
  the instances have then (StreamRL's one-step asynchronous pipelining).
- ``bounded``: eta = ``trainer.eta``; instances run different versions at once, synced lazily.
"""

from __future__ import annotations

from typing import Protocol

ETA_OF_MODE = {"sequential": 0, "sync": 0, "one_step": 1}


class ModeSettings(Protocol):
    mode: str
    eta: int


def eta_of(tc: ModeSettings) -> int:
    """The staleness bound of ``tc.mode`` (``trainer.eta`` in bounded mode)."""
    return tc.eta if tc.mode == "bounded" else ETA_OF_MODE[tc.mode]


def streams_training(tc: ModeSettings) -> bool:
    """Whether complete groups are backwarded while the head buffer still fills."""
    return tc.mode != "sequential"


def engines_behind(cfg, addresses: int) -> int:
    """Engine instances behind each SGS address: 1 when the trainer dials the instances, all of
    them (the most scale-out may add) when it dials one router in front of them."""
    if not cfg.uses_router:
        return 1
    total = cfg.scaleout.max_instances if cfg.scaleout.enabled else cfg.generation.instances
    return max(1, -(-total // max(1, addresses)))


def fleet_capacity(cfg, addresses: int) -> int:
    """Samples one SGS address takes at once, the fleet table's capacity for every workflow's picks
    (training and evaluation alike). Single-turn: ``instance_capacity``. Multi-turn: twice the
    rollout's concurrency (a turn per trajectory of training and of an evaluation beside it): the
    rollout's concurrency bounds what is in flight, and the SGS queues what its engine cannot admit."""
    if cfg.agentic.enabled:
        return 2 * cfg.agentic.concurrency
    tc = cfg.trainer
    return instance_capacity(tc.group_size + tc.redundancy_samples, tc.max_inflight_groups,
                             cfg.generation.max_inflight, engines_behind(cfg, addresses))


def instance_capacity(per_group: int, max_inflight_groups: int, engine_max_inflight: int, behind: int = 1) -> int:
    """Samples the orchestrator keeps in flight on one SGS address (``behind`` engine instances
    when it is a router), the same rule in every mode: the engine's admission
    (``generation.max_inflight``) in whole groups, or ``trainer.max_inflight_groups`` groups when
    that is set (> 0). The bound, not the capacity, is what limits how far generation runs ahead:
    a mode with a looser bound holds no less work in flight than a tighter one."""
    groups = max_inflight_groups or max(1, engine_max_inflight // per_group)
    return groups * per_group * behind
