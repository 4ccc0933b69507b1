"""StaleFlow's rollout coordination strategies (§5.3, Appendix D), as pure policy.

Snapshots in, commands out. The orchestrator (``services.rollout.coordination``) builds a snapshot
of every instance (its Health: running and queued samples, KV-cache use, version; plus what it
routed there since, StaleFlow's speculative state) and the trajectory server's contents (the
interrupted trajectories waiting to resume and the next new groups), then applies, in Algorithm 1's
order:

1. **synchronisation** (``to_sync``, Alg. 4): an instance behind the newest version that no waiting
   trajectory can be routed to is *tentatively* updated; only if routing would then place more of
   the waiting work is it synchronised (Interrupt its trajectories, Pull). Candidates are tried
   least loaded first, each on top of those already accepted (Braid's reading: StaleFlow's
   pseudocode tries each alone). An instance is never synced merely because it
   is idle, and never drains to sync: its trajectories come back and are routed again;
2. **migration** (``migrations``, Alg. 5): an instance with more than ``phi_wait`` samples queued
   gives up the excess; when the modelled throughput of the fastest instance exceeds
   ``phi_throughput`` x the slowest one's, the fastest gives up everything;
3. **routing** (``route``, Alg. 3): waiting trajectories in a multi-level queue by ``V_traj``
   (oldest first; new ones, without a ``V_traj``, last); each goes to the routable instance of the
   oldest version group whose marginal gain in modelled throughput (eq. 2-4) reaches ``mu`` x the
   gain of an idle instance; when none does, it is *withheld* and routing stops (the running work
   finishes and the next decision gains more). A trajectory that may resume only on its own version
   (``exact``, Braid's case without partial rollout) waits for such an instance without stopping the
   others: its candidates are far fewer than theirs.

The throughput model is eq. 2 on the instance's step cost (``scheduling.cost.StepCost``, StaleFlow's
k1..k4 plus Braid's CPU term): ``T(n, kv) = n / step(n, kv)`` samples-tokens per second.

Braid's units: a new trajectory is a whole GRPO group (``samples`` sequences of one prompt, routed
together as one Generate, reserved as one staleness entry); a resumed one is one sample. Without
partial rollout a trajectory must finish on the weights it started with (``exact``): it resumes
only on an instance at its own version.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from services.generation.scheduling.cost import InstanceSpec


@dataclass(frozen=True)
class CoordinationSettings:
    mu: float = 0.3  # a route must gain at least mu x an idle instance's gain (StaleFlow §6: 0.3)
    phi_wait: int = 3  # queued samples an instance may hold before the excess migrates
    phi_throughput: float = 5.0  # fastest / slowest modelled throughput that triggers a migration
    migrate: bool = False  # the run's default (trainer.coordination.migrate)


@dataclass(frozen=True)
class Load:
    """One instance in a (speculative) snapshot."""

    index: int
    version: int
    running: int  # samples decoding
    waiting: int  # samples queued there (admitted by the SGS, not by the engine)
    kv_tokens: float  # KV-cache tokens in use
    capacity: int  # samples it may hold (running + waiting)
    alive: bool = True

    @property
    def holding(self) -> int:
        return self.running + self.waiting


@dataclass(frozen=True)
class Traj:
    """A trajectory in the trajectory server: a new group (``v_traj`` None) or an interrupted sample."""

    key: str
    v_traj: int | None
    tokens: int  # its context now (prompt + generated so far): the KV it takes when admitted
    samples: int = 1
    exact: bool = False  # without partial rollout: resumes only on an instance at exactly ``v_traj``


class Budget(Protocol):
    """The staleness manager's part routing needs (``StalenessManager``, or a copy to plan on)."""

    def can_reserve(self, version: int) -> bool: ...

    def reserve(self, key: str, version: int) -> int: ...


@dataclass(frozen=True)
class Route:
    key: str
    instance: int
    v_traj: int  # the version the trajectory runs at (a new group's reservation)


class ThroughputModel:
    """Eq. 2-4 on one instance's step cost and limits."""

    def __init__(self, spec: InstanceSpec) -> None:
        self.spec = spec
        self.kv_limit = spec.kv_capacity_tokens * (1.0 - spec.watermark)

    def throughput(self, running: int, kv_tokens: float) -> float:
        """Eq. 2: tokens per second of ``running`` sequences holding ``kv_tokens``."""
        return running / self.spec.cost.step(running, kv_tokens) if running > 0 else 0.0

    def admits(self, load: Load, traj: Traj) -> bool:
        """Eq. 3's gamma: the engine starts it at once (KV room, nothing queued, under its batch limit)."""
        return (load.waiting == 0 and load.running + traj.samples <= self.spec.max_batch
                and load.kv_tokens + traj.samples * traj.tokens <= self.kv_limit)

    def after(self, load: Load, traj: Traj) -> Load:
        """The instance once ``traj`` is routed there (eq. 3: running, or queued)."""
        if self.admits(load, traj):
            return replace(load, running=load.running + traj.samples,
                           kv_tokens=load.kv_tokens + traj.samples * traj.tokens)
        return replace(load, waiting=load.waiting + traj.samples)

    def gain(self, load: Load, traj: Traj) -> float:
        """Eq. 4: the throughput ``traj`` adds on ``load``'s instance (0 when it would only queue)."""
        new = self.after(load, traj)
        return self.throughput(new.running, new.kv_tokens) - self.throughput(load.running, load.kv_tokens)

    def ideal(self, traj: Traj) -> float:
        """The gain of an idle instance: the upper bound a route is measured against."""
        return self.throughput(traj.samples, traj.samples * traj.tokens)


def routable(traj: Traj, load: Load, can_reserve: Callable[[int], bool]) -> bool:
    """Alg. 2, with room: a new group needs a reservation at the instance's version; a resumed
    trajectory an instance not older than its ``V_traj`` (exactly it, without partial rollout)."""
    if not load.alive or load.holding + traj.samples > load.capacity:
        return False
    if traj.v_traj is None:
        return can_reserve(load.version)
    return load.version == traj.v_traj if traj.exact else load.version >= traj.v_traj


def _choose(traj: Traj, candidates: list[Load], model: ThroughputModel, mu: float) -> Load | None:
    """The waterfall (Alg. 3 step 4): version groups oldest first; the best gain of the first group
    whose best reaches ``mu`` x the ideal gain; None: withhold."""
    threshold = mu * model.ideal(traj)
    for version in sorted({c.version for c in candidates}):
        gain, _, best = max((model.gain(c, traj), -c.index, c) for c in candidates if c.version == version)
        if gain >= threshold:
            return best
    return None


def route(trajs: Sequence[Traj], loads: Sequence[Load], model: ThroughputModel, budget: Budget,
          mu: float) -> tuple[list[Route], list[Load]]:
    """Alg. 3: the routes of the waiting trajectories, in order, and the loads after them. A new
    group's reservation is made on ``budget`` as it is routed (pass a copy to plan without effect)."""
    loads = list(loads)
    queues: dict[int | None, list[Traj]] = {}
    for t in trajs:
        queues.setdefault(t.v_traj, []).append(t)
    order = sorted(queues, key=lambda v: (v is None, v if v is not None else 0))
    routes: list[Route] = []
    position = {ld.index: k for k, ld in enumerate(loads)}
    for v in order:
        for traj in queues[v]:
            reservable = _memo(budget.can_reserve)  # a few versions, asked of every instance: once each
            candidates = [ld for ld in loads if routable(traj, ld, reservable)]
            # an exact resume can go only to its version's instances, all busy with that version's tail:
            # holding it back for a better gain only delays a trajectory already reserved
            chosen = _choose(traj, candidates, model, 0.0 if traj.exact else mu) if candidates else None
            if chosen is None and traj.exact:
                continue  # it waits for an instance of its own version; it holds back nothing else
            if chosen is None:  # no instance can take it, or none gains enough: withhold, stop
                return routes, loads
            v_traj = traj.v_traj if traj.v_traj is not None else chosen.version
            if traj.v_traj is None:
                budget.reserve(traj.key, chosen.version)
            routes.append(Route(traj.key, chosen.index, v_traj))
            loads[position[chosen.index]] = model.after(chosen, traj)
    return routes, loads


def _memo(can_reserve: Callable[[int], bool]) -> Callable[[int], bool]:
    """``can_reserve`` asked once per version (valid until the next reservation)."""
    seen: dict[int, bool] = {}

    def ask(version: int) -> bool:
        if version not in seen:
            seen[version] = can_reserve(version)
        return seen[version]
    return ask


def to_sync(loads: Sequence[Load], trajs: Sequence[Traj], newest: int, model: ThroughputModel,
            plan_budget: Callable[[], Budget], can_reserve: Callable[[int], bool], mu: float) -> list[int]:
    """Alg. 4: instances to synchronise to ``newest`` now. ``plan_budget`` makes a fresh copy of the
    staleness budget for each tentative routing (it reserves nothing real).

    The candidates (behind ``newest``, nothing waiting routable at their version) are taken one
    after another, the least loaded first, each tentatively updated *on top of the updates already
    accepted*; one is synced only when routing then places more of the waiting trajectories than
    without it (the sync is expected to raise throughput). StaleFlow's pseudocode updates each
    candidate on its own, which syncs every candidate whenever work waits, interrupting busy
    instances that idle ones could have spared (bench/fleet_async.py: 0.83x the lazy policy)."""
    def bare(ld: Load) -> Load:
        return replace(ld, running=0, waiting=0, kv_tokens=0.0)

    reservable = _memo(can_reserve)
    candidates = sorted((ld for ld in loads if ld.alive and ld.version < newest
                         and not any(routable(t, bare(ld), reservable) for t in trajs)),
                        key=lambda ld: (ld.holding, ld.index))
    tentative, out = list(loads), []
    placed = len(route(trajs, tentative, model, plan_budget(), mu)[0]) if candidates else 0
    failed = -1  # the largest capacity a tentative update did not help
    for ld in candidates:
        if placed == len(trajs):  # every waiting trajectory is placed: no further sync places more
            break
        # a tentatively updated candidate is an empty instance at ``newest`` whatever it held, and its
        # old load mattered to nothing waiting: one no larger than a candidate that did not help
        # would not help either (up to ties), so Alg. 4 costs a routing per sync, plus one
        if ld.capacity <= failed:
            continue
        trial = list(tentative)
        trial[loads.index(ld)] = replace(bare(ld), version=newest)
        routes, _ = route(trajs, trial, model, plan_budget(), mu)
        if len(routes) > placed and any(r.instance == ld.index for r in routes):
            out.append(ld.index)
            tentative, placed = trial, len(routes)
        else:
            failed = max(failed, ld.capacity)
    return out


def migrations(loads: Sequence[Load], model: ThroughputModel, settings: CoordinationSettings) -> dict[int, int]:
    """Alg. 5: instance -> samples to interrupt and return to the trajectory server (all of them
    for the throughput case)."""
    out: dict[int, int] = {}
    live = [ld for ld in loads if ld.alive and ld.holding > 0]
    for ld in live:
        if ld.waiting > settings.phi_wait:
            out[ld.index] = ld.waiting - settings.phi_wait
    if len(live) >= 2:
        speed = {ld.index: model.throughput(ld.running, ld.kv_tokens) for ld in live}
        fast, slow = max(speed, key=speed.__getitem__), min(speed, key=speed.__getitem__)
        if speed[slow] > 0 and speed[fast] / speed[slow] > settings.phi_throughput:
            out[fast] = next(ld.holding for ld in live if ld.index == fast)
    return out
