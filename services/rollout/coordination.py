"""StaleFlow's snapshot-command cycle in the orchestrator (``trainer.coordination.policy: staleflow``):
the mechanism around ``services.rollout.staleflow``'s strategies.

Each orchestrator tick runs one cycle (Algorithm 1):

1. **Snapshot** every ``interval_s``: each live instance's Health (running and queued samples, KV
   use). Between snapshots, and to validate one (StaleFlow's speculative state), the fleet table's
   ``inflight`` is the truth about how many samples an instance holds: samples routed since the
   snapshot are added as arrivals, samples finished since are taken off.
2. **Synchronise** (Alg. 4, once per snapshot and per new version): each instance the strategy
   picks has its open calls interrupted (their trajectories come back with their tokens and wait
   to be routed again) and is offered the newest weights, which it installs at once: nothing
   drains. Without partial rollout a trajectory must finish on the version it started with, so an
   instance syncs only when the samples it holds fit on other live instances of its version (else
   it keeps its tail, as before).
3. **Migrate** (Alg. 5): interrupt the excess of a long queue, or everything on the fastest instance
   when the throughput gap is too wide; once per snapshot (the next decision waits for a snapshot
   taken after the interrupts, as StaleFlow's validation does), never on an instance interrupted
   since the snapshot.
4. **Route** (Alg. 3) the waiting trajectories: interrupted ones first (oldest ``V_traj`` first),
   then the next new groups (``PromptPool.peek_many``), each by marginal gain with the ``mu``
   threshold; a new group's staleness entry is reserved as it is routed; the rest are withheld.

A resumed trajectory that must finish on its own version but whose version no live instance runs
any more (every one of them synced or was lost) resumes on a newer one (counted:
``exact_relaxed``), so nothing waits forever.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import replace

import grpc

from services.common.types import HealthSnapshot, PromptSpec
from services.rollout.repack import health_of
from services.rollout.routing import InstanceView
from services.rollout.staleflow import (
    CoordinationSettings,
    Load,
    ThroughputModel,
    Traj,
    migrations,
    route,
    to_sync,
)

log = logging.getLogger("braid.coordination")


def coordination_spec(cfg, model_dir: str):
    """The instance cost model the strategies plan with: the emulation's profile for emulated
    engines, else the dispatch cost model (``router_main.load_spec``)."""
    gen = cfg.generation
    if gen.engine == "emulated":
        from services.generation.emulated_engine import resolve_profile

        return resolve_profile(gen.emulation.profile).instance_spec(
            max_batch=gen.max_inflight, kv_capacity_tokens=gen.num_blocks * gen.page_size)
    from services.generation.router_main import load_spec

    return load_spec(gen, model_dir)


class Coordinator:
    """Snapshots, speculative loads and the prompts encoded ahead for routing."""

    def __init__(self, cfg, model_dir: str, group_samples: int) -> None:
        c = cfg.trainer.coordination
        self.settings = CoordinationSettings(c.mu, c.phi_wait, c.phi_throughput, c.migrate)
        self.interval_s = c.interval_s
        self.model = ThroughputModel(coordination_spec(cfg, model_dir))
        self.exact = not cfg.trainer.partial_rollout
        self.group_samples = group_samples
        self.snaps: dict[int, HealthSnapshot] = {}
        self.taken_at = 0.0
        self.moved: set[int] = set()  # instances interrupted since the last snapshot (one command each)
        self.migrated = False  # a migration since the last snapshot: the next waits for a fresh one
        self.sync_checked: tuple | None = None  # (snapshot, version, emptied instances) Alg. 4 last ran on
        self.specs: dict[str, PromptSpec] = {}  # upcoming prompts, encoded once
        self.prompt_tokens = 64  # typical prompt length (updated from encoded prompts)

    # ------------------------------------------------------------------ snapshots
    def refresh(self, clients, views: list[InstanceView], on_lost) -> None:
        """Health of every live instance when a snapshot is due (an unanswering one is lost)."""
        now = time.monotonic()
        if now - self.taken_at < self.interval_s:
            return
        self.taken_at, self.moved, self.migrated = now, set(), False
        for v in views:
            if not v.alive:
                self.snaps.pop(v.index, None)
        self.snaps.update(health_of(clients, [v.index for v in views if v.alive], on_lost))

    def loads(self, views: list[InstanceView]) -> list[Load]:
        """Every instance's load: the last snapshot, validated against the table's samples in flight."""
        return [self._load(v) for v in views]

    def _load(self, v: InstanceView) -> Load:
        h = self.snaps.get(v.index)
        if h is None:
            base = Load(v.index, v.version, 0, 0, 0.0, v.capacity, v.alive)
            return self.model.after(base, Traj("", None, self.prompt_tokens, v.inflight)) if v.inflight else base
        kv = h.kv_usage * self.model.spec.kv_capacity_tokens
        load = Load(v.index, v.version, h.running, h.waiting, kv, v.capacity, v.alive)
        extra = v.inflight - load.holding
        if extra > 0:  # routed since the snapshot: arriving
            return self.model.after(load, Traj("", None, self.prompt_tokens, extra))
        if extra < 0:  # finished since: off the queue first, then off the batch with their share of KV
            gone_waiting = min(load.waiting, -extra)
            gone_running = -extra - gone_waiting
            share = kv / load.running if load.running else 0.0
            load = replace(load, waiting=load.waiting - gone_waiting, running=load.running - gone_running,
                           kv_tokens=max(0.0, kv - share * gone_running))
        return load

    # ------------------------------------------------------------------ the waiting trajectories
    def new_groups(self, pool, encode, loads: list[Load], limit: int) -> list[Traj]:
        """The next new groups as trajectories, as many as the fleet has room for (at most ``limit``)."""
        room = sum(max(0, ld.capacity - ld.holding) for ld in loads if ld.alive) // self.group_samples
        problems = pool.peek_many(min(room, limit)) if room > 0 else []
        todo = [p for p in problems if p.prompt_id not in self.specs]
        if todo:
            self.specs.update((s.prompt_id, s) for s in encode(todo))
            lengths = [len(s.token_ids) for s in self.specs.values()]
            self.prompt_tokens = max(1, round(sum(lengths) / len(lengths)))
        return [Traj(p.prompt_id, None, len(self.specs[p.prompt_id].token_ids), self.group_samples)
                for p in problems]

    def resumes(self, partials, loads: list[Load]) -> list[Traj]:
        """The interrupted trajectories; exact (own version only) while a live instance runs it."""
        versions = {ld.version for ld in loads if ld.alive}
        out = []
        for p in partials:
            exact = self.exact and p.version in versions
            out.append(Traj(p.key, p.version, len(p.prompt_token_ids) + len(p.token_ids), 1, exact))
        return out

    def spec_of(self, key: str) -> PromptSpec:
        return self.specs.pop(key)

    # ------------------------------------------------------------------ decisions
    def to_sync(self, loads: list[Load], trajs: list[Traj], newest: int, mgr) -> list[int]:
        """Alg. 4 once per snapshot, per new version and per instance the speculative state shows
        emptied behind ``newest`` (its tentative routings copy the staleness budget and route every
        waiting trajectory per candidate: too dear for every tick; an instance that empties between
        snapshots is looked at at once, not up to ``interval_s`` later)."""
        emptied = tuple(ld.index for ld in loads if ld.alive and ld.holding == 0 and ld.version < newest)
        key = (self.taken_at, newest, emptied)
        if self.sync_checked == key:
            return []
        self.sync_checked = key
        chosen = to_sync(loads, trajs, newest, self.model, lambda: copy.deepcopy(mgr), mgr.can_reserve,
                         self.settings.mu)
        if not self.exact:
            return chosen
        loads, out = list(loads), []
        for i in chosen:  # one by one: a synced instance's tail fills the others of its version
            if self._tail_fits(i, loads):
                out.append(i)
                loads = self._tail_moved(i, loads, newest)
        return out

    @staticmethod
    def _peers(i: int, loads: list[Load]) -> list[Load]:
        return [ld for ld in loads if ld.alive and ld.index != i and ld.version == loads[i].version]

    def _tail_fits(self, i: int, loads: list[Load]) -> bool:
        """Without partial rollout: the samples ``i`` holds fit on other live instances of its version."""
        return loads[i].holding <= sum(ld.capacity - ld.holding for ld in self._peers(i, loads))

    def _tail_moved(self, i: int, loads: list[Load], newest: int) -> list[Load]:
        """``loads`` once ``i``'s samples wait on its peers and ``i`` runs ``newest``, empty."""
        out, left = list(loads), loads[i].holding
        for ld in self._peers(i, loads):
            take = min(left, ld.capacity - ld.holding)
            out[ld.index] = replace(ld, waiting=ld.waiting + take)
            left -= take
        out[i] = replace(loads[i], version=newest, running=0, waiting=0, kv_tokens=0.0)
        return out

    def migrations(self, loads: list[Load]) -> dict[int, int]:
        """Alg. 5 on a snapshot no migration has acted on yet (StaleFlow's validation: a decision waits
        for a snapshot that shows the last commands' effect), without instances interrupted since."""
        if not self.settings.migrate or self.migrated:
            return {}
        plan = migrations([ld for ld in loads if ld.index not in self.moved], self.model, self.settings)
        plan = {i: n for i, n in plan.items() if not self.exact or self._tail_fits(i, loads)}
        self.migrated = bool(plan)
        return plan

    def route(self, trajs: list[Traj], loads: list[Load], mgr):
        return route(trajs, loads, self.model, mgr, self.settings.mu)


def _open_calls(o, i: int) -> list:
    """Instance ``i``'s open calls, newest first (a queue's tail is its newest)."""
    calls = [c for st in o.groups.values() if not st.complete for c in st.calls
             if c.instance == i and c.open and c.handle is not None and not c.handle.cancelled]
    return sorted(calls, key=lambda c: c.launched, reverse=True)


def _interrupt(o, i: int, samples: int | None) -> int:
    """Interrupt open calls on ``i`` (the newest, until ``samples`` are covered; None: all); how many
    samples the instance returned. An unanswering instance is lost (its trajectories resume)."""
    calls = _open_calls(o, i)
    if samples is not None:
        chosen, covered = [], 0
        for c in calls:
            if covered >= samples:
                break
            chosen.append(c)
            covered += c.open
        calls = chosen
    if not calls:
        return 0
    try:
        return o.rt.clients[i].interrupt([c.tag for c in calls])
    except grpc.RpcError as err:
        if err.code() != grpc.StatusCode.UNAVAILABLE:
            raise RuntimeError(f"SGS instance {i} refused Interrupt: {err.details()}") from err
        o._lose_instance(i, f"Interrupt: {err.details()}")
        return 0


def cycle(o) -> None:
    """One snapshot-command cycle of orchestrator ``o`` (Algorithm 1)."""
    c: Coordinator = o.coord
    views = o.fleet.views()
    c.refresh(o.rt.clients, views, o._lose_instance)
    loads = c.loads(views)
    version, state = o.latest
    limit = (o.mgr.eta + 1) * o.mgr.capacity
    trajs = c.resumes(o.resume, loads) + c.new_groups(o.prompts, o.rt.prompt_specs, loads, limit)
    for i in c.to_sync(loads, trajs, version, o.mgr):
        o.counts["sync_interrupted"] += _interrupt(o, i, None)
        c.moved.add(i)
        if o.publisher.offer_to(i, version, state):
            o.counts["syncs"] += 1
            loads[i] = replace(loads[i], version=version, running=0, waiting=0, kv_tokens=0.0)
    for i, n in c.migrations(loads).items():
        o.counts["migrations"] += 1
        o.counts["migrated_samples"] += _interrupt(o, i, n)
        c.moved.add(i)
    routes, _ = c.route(trajs, loads, o.mgr)
    resumes = {p.key: p for p in o.resume}
    views = o.fleet.views()
    for r in routes:
        p = resumes.pop(r.key, None)
        if p is not None:
            o.counts["exact_relaxed"] += int(c.exact and views[r.instance].version != p.version)
            o._launch_resume(p, views[r.instance])
            continue
        problem = o.prompts.take()
        assert problem.prompt_id == r.key, (problem.prompt_id, r.key)  # routes take new groups in pool order
        estimate = o.estimates.take([problem])[0] if o.estimates is not None else None
        o._launch_group(problem, c.spec_of(r.key), r.instance, r.v_traj, estimate)
    o.resume = list(resumes.values())
