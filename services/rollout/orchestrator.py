"""The rollout orchestrator: every pipeline mode on one path (Laminar / StaleFlow's rollout manager).

Modes are values of the staleness bound eta (``services.rollout.modes``): ``sync`` is eta 0,
``one_step`` eta 1, ``bounded`` ``trainer.eta``; ``sequential`` is eta 0 with training held
until the batch is complete. One thread observes, asks the pure policies, and acts:

1. **sync** — ``routing.instances_to_sync`` says which SGS instances take the newest weights
   (lazily: when the bound stops them from starting work at their version, or when idle).
   Instances therefore run different versions at once (with eta 0 every instance syncs as soon
   as a step lands: the bound forbids work at an older version).
2. **route** — interrupted trajectories resume first (partial rollout: prompt + tokens so far,
   on any instance whose version is not older than their ``V_traj``); then new GRPO groups
   start wherever ``StalenessManager.can_reserve`` allows (StaleFlow Algorithm 2), each as
   one Generate call of ``group_size + redundancy_samples`` samples with
   ``min_weight_version = V_traj``, and is *reserved* in the manager.
3. **collect** — samples stream back from all calls into one queue. A finished sample is
   scored at once; a group with ``group_size`` finished samples is complete: its surplus is
   cancelled, DAPO's filter may abort it, otherwise it is *occupied* and written to the
   experience buffer. Interrupted samples (partial rollout) update the partial-response pool.
4. **train** — occupied groups of the head buffer are final, so their gradients are computed
   as soon as they appear (streaming; not in ``sequential``); when the head buffer is Ready
   it is *consumed*: one optimizer step, version + 1.

**Repack** (Laminar §5, ``trainer.repack``; ``services.rollout.repack``): every interval the
orchestrator snapshots the instances (KV use, running, queued, version); the long tails of
ramping-down instances are migrated (Interrupt, then resumed on a destination of the same
version) so the sources are freed to take newer weights. Migration keeps each trajectory's
``V_traj`` and entry.

**Instance failure** (Laminar §3.3): when a call fails with UNAVAILABLE the instance is
marked dead; every trajectory the partial-response pool places on it resumes elsewhere from
the tokens recorded so far (its ``V_traj`` and reserved entry unchanged), so no trajectory
is lost. The run fails only when no instance is left.

Every consumed trajectory satisfies ``V_traj + eta >= V_buf`` (checked again here and
counted in ``bound_violations``, which must stay 0). Metrics add the staleness histogram of
each consumed buffer (StaleFlow Fig. 18), Laminar's inherent staleness, RollArt's bound
aborts, interrupts and redundancy surplus.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

import grpc

from services.common.types import GenerateParams, PromptSpec, SampleRecord
from services.generation.client import GenerateCall
from services.generation.scheduling.pools import eligible_instances
from services.rollout import checkpoint, coordination
from services.rollout.dispatching import NewGroup, build_dispatcher, group_estimates
from services.rollout.fleet import HOLDS_WORK, Reservation
from services.rollout.keeper import FleetKeeper
from services.rollout.length_replay import load_replay
from services.rollout.lifecycle import GroupLifecycle, drain
from services.rollout.modes import engines_behind, fleet_capacity
from services.rollout.pools import Partial, PartialResponsePool, PromptPool
from services.rollout.repack import Repacker
from services.rollout.rewards import Outcome
from services.rollout.routing import InstanceView, instances_to_sync, pick_instance, pull_on_completion
from services.rollout.staleness import ConsumeResult
from services.run.runtime import Published, TrainerRuntime
from services.tasks.source import TaskItem
from services.trainer.learner import Group

log = logging.getLogger("braid.rollout")


@dataclass
class _Call:
    instance: int
    group: str
    keys: list[str]  # partial-pool keys of the samples this call produces
    handle: GenerateCall | None = None
    open: int = 0  # samples not yet returned
    tag: str = ""  # the Generate request tag (what an Interrupt names)
    launched: float = 0.0  # when the orchestrator started the call (time.time())
    booked: Reservation | None = None  # its samples on the fleet table (released as they return)


@dataclass
class _GroupState:
    problem: TaskItem
    v_traj: int
    finished: dict[int, tuple[SampleRecord, Future[Outcome]]] = field(default_factory=dict)  # reward pending
    calls: list[_Call] = field(default_factory=list)
    complete: bool = False
    forced: int = 0  # the group's forced length (0 = the policy decides); a resumed sample generates the rest
    forced_lengths: tuple[int, ...] = ()  # or each sample's (a replayed visit trace)
    estimate: float | None = None  # its estimated output length (with a length estimator)


def open_call_intervals(groups, t_end: float) -> list[tuple[float, float]]:
    """Generation is busy while a sample runs, but a sample still running at ``t_end`` reports
    its interval only when it finishes: count each call still open as busy from its launch
    (admitted work) to ``t_end``, so an iteration is not called idle while work is in flight."""
    return [(c.launched, t_end) for st in groups for c in st.calls if c.open]


class Orchestrator(GroupLifecycle):
    """The single-turn workflow over the runtime (``runtime.TrainerRuntime``): ``run(iterations)``."""

    offer_on_step = False  # instances take a new version when routing says so (``_sync``)
    # a tick handles streamed samples for at most this long, then syncs, repacks and routes again: with
    # dozens of instances streaming, an unbounded drain held the loop for seconds (23 ticks in a whole
    # 16-instance emulated run, 2026-11-30), so new groups, syncs and repack checks waited on it
    COLLECT_BUDGET_S = 0.05

    def __init__(self, trainer: TrainerRuntime) -> None:
        super().__init__(trainer)
        tc = self.tc
        self.max_new = trainer.cfg.generation.max_new_tokens
        self.partial = PartialResponsePool()
        self.events: queue.Queue = queue.Queue()
        self.publisher = trainer.publisher
        trainer.publisher.push_errors_fatal = False  # a failed push loses that instance (on the table, at once)
        self.behind = engines_behind(trainer.cfg, len(trainer.clients))
        self.capacity = fleet_capacity(trainer.cfg, len(trainer.clients))
        self.groups: dict[str, _GroupState] = {}
        self.resume: list[Partial] = []
        self.latest: tuple[int, object] = (trainer.version, trainer.start_snapshot)  # (version, transport snapshot)
        self.gen_busy: list[tuple[float, float]] = []
        # the run's table of the instances (``fleet.Fleet``; evaluation picks on it too, the publisher offers
        # by it and records what it offered): health, offered version, load, groups launched
        self.fleet = trainer.fleet
        assert self.publisher.fleet is self.fleet and self.fleet.capacity == self.capacity
        self.repack = Repacker.from_config(tc.repack)
        self.repack.on_change = self.fleet.set_incoming  # migrations count on their destination's load
        self.dispatcher = build_dispatcher(trainer, self.behind)
        self.keeper = FleetKeeper(trainer, self.fleet, self.counts, on_lost=self._resume_lost)
        replay = trainer.cfg.forced_length_replay
        self.replay = load_replay(replay, self.max_new)
        self.estimates = group_estimates(self.dispatcher, self.replay, trainer.cfg.generation.dispatch.run_signals,
                                         tc.group_size + tc.redundancy_samples, self.max_new)
        lpt = self.estimates is not None and trainer.cfg.generation.admission == "lpt"
        batches = self.estimates.launch_order(trainer.sampler.batch) if lpt else trainer.sampler.batch
        self.prompts: PromptPool[TaskItem] = PromptPool.from_batches(batches, tc.prompts_per_iteration)
        self.stepped = False  # an optimizer step since the last repack check (check at once)
        staleflow = trainer.cfg.trainer.coordination.policy == "staleflow"
        self.coord = coordination.Coordinator(trainer.cfg, trainer.model_dir, tc.group_size + tc.redundancy_samples) \
            if staleflow else None
        if trainer.runner_state is not None:  # resumed from a recovery checkpoint
            self._restore(checkpoint.restore(trainer.runner_state, trainer.version, batches, tc.prompts_per_iteration))
        self.start_head()

    def _restore(self, r: checkpoint.Restored) -> None:
        self.mgr, self.prompts = r.manager, r.prompts
        self.counts.update(r.counts)  # in place: the fleet counts into the same Counter
        self.mgr.end = self.tc.iterations  # the resumed run's (it may have been changed for the resume)
        for key, (problem, v_traj, group) in r.finished.items():
            self.groups[key] = _GroupState(problem, v_traj, complete=True)
            self.experience.put(key, group)
            self.failures_of[key] = r.failures.get(key, 0)
            self.rt.problems[key] = problem

    def tick(self) -> None:
        self.keeper.poll(self.latest)
        if self.coord is not None:  # StaleFlow's snapshot-command cycle
            coordination.cycle(self)
        else:
            self._sync()
            self._repack()
            self._route()
        self._collect(timeout=0.02)
        self.head.train_head()

    def checkpoint_state(self) -> dict:
        return checkpoint.capture(self)

    def _holds_work(self, i: int) -> bool:
        """Whether instance ``i`` is up (live, or draining what it holds): not joining, lost or removed."""
        return self.fleet.snapshot()[i].state in HOLDS_WORK

    def _up(self) -> list[bool]:
        """``_holds_work`` of every instance, from one snapshot."""
        return [r.state in HOLDS_WORK for r in self.fleet.snapshot().rows]

    def _sync(self) -> None:
        """Offer the newest weights where routing says (the publisher records each offer on the row; an
        instance whose push failed is lost on the table already, and ``keeper.notice`` resumes its work)."""
        version, state = self.latest
        idle_only = pull_on_completion(self.tc.partial_rollout)
        for i in instances_to_sync(self.fleet.views(), version, self.mgr.can_reserve, idle_only):
            if self.publisher.offer_to(i, version, state):
                self.counts["syncs"] += 1

    def _repack(self) -> None:
        """Snapshot the instances when due; carry out the repack plan (Interrupt on each source)."""
        plan = self.repack.check(self.rt.clients, self._up(), self._lose_instance, force=self.stepped)
        self.stepped = False
        for m in plan:
            rows = self.fleet.snapshot()
            if not (rows[m.source].state in HOLDS_WORK and rows[m.destination].state == "live"):
                continue
            calls = [c for st in self.groups.values() if not st.complete for c in st.calls
                     if c.instance == m.source and c.open and c.handle is not None and not c.handle.cancelled]
            waiting = {r.key for r in self.resume}  # interrupted already, not running on the source
            keys = [p.key for p in self.partial.on_instance(m.source) if p.key not in waiting]
            try:
                self.repack.start(m, keys, [c.tag for c in calls], self.rt.clients[m.source])
            except grpc.RpcError as err:  # the source went away: its trajectories resume from the pool
                for k in keys:
                    self.repack.forget(k)
                if err.code() == grpc.StatusCode.UNAVAILABLE:
                    self._lose_instance(m.source, f"Interrupt: {err.details()}")
                else:
                    raise RuntimeError(f"SGS instance {m.source} refused Interrupt: {err.details()}") from err

    def _resume_target(self, p: Partial) -> InstanceView | None:
        """A migrated trajectory resumes on its planned destination when that is still routable;
        any other trajectory (or a migration whose destination is gone) where routing says."""
        views = self.fleet.views()
        dst = self.repack.destination(p.key)
        if dst is not None and views[dst].alive and views[dst].version >= p.version:
            return views[dst]
        return pick_instance(p.version, views, self.mgr.can_reserve,
                             eligible=self._eligible(self.groups[p.group].problem.task))

    def _eligible(self, task: str) -> list[int] | None:
        """The instances a task may use (``generation.affinity``: RollArt's hardware affinity), None
        = any; the pick takes the live ones among them (a pool whose instances are all restarting
        waits for them). A router in front of the instances applies affinity itself."""
        gen = self.rt.cfg.generation
        if not gen.affinity or self.behind > 1:
            return None
        return eligible_instances(task, gen, range(len(self.fleet)))

    # ------------------------------------------------------------------ routing
    def _route(self) -> None:
        waiting = []
        for p in sorted(self.resume, key=lambda p: p.version):
            inst = self._resume_target(p)
            if inst is None:
                waiting.append(p)
            else:
                self._launch_resume(p, inst)
        self.resume = waiting
        g = self.tc.group_size + self.tc.redundancy_samples
        batch: list[tuple[TaskItem, Reservation]] = []  # the groups this round starts, where the pick put them
        while (inst := self.fleet.acquire(None, self.mgr.can_reserve, need=g, count=False,
                                          eligible=self._eligible(self.prompts.peek().task))) is not None:
            problem = self.prompts.take()
            self.mgr.reserve(problem.prompt_id, inst.version)  # V_traj = the picked instance's version
            batch.append((problem, inst))  # booked: the next pick sees it
        for _, inst in batch:  # placement may move it; the launch books it where it goes
            self.fleet.release(inst)
        specs = self.rt.prompt_specs([p for p, _ in batch])  # encoded once: placement and launch share them
        targets, estimates = self._placement(batch, specs, g)
        for (problem, inst), spec in zip(batch, specs, strict=True):
            key = problem.prompt_id
            self._launch_group(problem, spec, targets.get(key, inst.index), inst.version, estimates.get(key))

    def _placement(self, batch: list[tuple[TaskItem, Reservation]], specs: list[PromptSpec],
                   g: int) -> tuple[dict[str, int], dict]:
        """With a length estimator: where the dispatch policy puts this round's groups, and their
        estimates (``services.rollout.dispatching``); otherwise where the pick put them."""
        if self.dispatcher is None or not batch:
            return {}, {}
        problems = [p for p, _ in batch]
        estimates = self.estimates.take(problems)
        groups = [NewGroup(p.prompt_id, len(s.token_ids), e, g)
                  for p, s, e in zip(problems, specs, estimates, strict=True)]
        targets = self.dispatcher.plan_round(groups, [inst for _, inst in batch],
                                             [self._eligible(p.task) for p in problems],
                                             self.fleet.views(), self.capacity)
        return targets, {p.prompt_id: e for p, e in zip(problems, estimates, strict=True) if e is not None}

    def _launch_group(
        self, problem: TaskItem, spec: PromptSpec, index: int, v_traj: int, estimate: float | None
    ) -> None:
        key = problem.prompt_id
        n = self.tc.group_size + self.tc.redundancy_samples
        forced, per = (self.replay.forced(problem, n) if self.replay
                       else (self.rt.cfg.forced_length_ramp.length(self.version), ()))
        state = _GroupState(problem, v_traj, forced=forced, forced_lengths=per, estimate=estimate)
        self.groups[key] = state
        forward = estimate if estimate is not None and self.rt.cfg.generation.dispatch.forward_estimates else 0.0
        # the instance admits it LPT by the estimate
        spec = replace(spec, forced_length=forced, forced_lengths=per, estimated_length=forward)
        call = _Call(index, key, [f"{key}/{i}" for i in range(n)], tag=f"group-{key}")
        for i, pkey in enumerate(call.keys):
            self.partial.start(Partial(pkey, key, i, spec.token_ids, v_traj, index))
        params = GenerateParams(n, 0, v_traj, tag=call.tag, interruptible=self.tc.partial_rollout)
        self._start(call, [spec], params, state, group=True)

    def _launch_resume(self, p: Partial, inst: InstanceView) -> None:
        state = self.groups[p.group]
        self.partial.move(p.key, inst.index)
        self.repack.launched(p.key, inst.index)
        call = _Call(inst.index, p.group, [p.key], tag=f"resume-{p.key}#{p.segments}")
        # a forced-length group's sample generates what it lacks of its length (EOS ignored, as before)
        total = state.forced_lengths[p.sample_index] if state.forced_lengths else state.forced
        forced = max(1, total - len(p.token_ids)) if total else 0
        spec = PromptSpec(f"{p.key}#{p.segments}", p.prompt_token_ids + p.token_ids, p.group, forced_length=forced)
        left = forced or self.max_new - len(p.token_ids)
        # interrupted by a new version only under partial rollout; a repack may interrupt it again
        params = GenerateParams(1, left, p.version, tag=call.tag, interruptible=self.tc.partial_rollout)
        self.counts["resumed"] += 1
        self._start(call, [spec], params, state)

    def _start(self, call: _Call, prompts: list[PromptSpec], params: GenerateParams, state: _GroupState,
               group: bool = False) -> None:
        """Book the call's samples on its instance (``group``: a new group, counted there, each sample
        with its estimated work) and start it."""
        call.open = len(call.keys)
        call.launched = time.time()
        work = (state.estimate or 0.0) if group and self.dispatcher is not None else 0.0
        call.booked = self.fleet.reserve(call.instance, call.open, over=True, count=group, work=work)
        if call.booked is None:  # lost since the pick (a weight push failed on its pusher's thread): elsewhere
            moved = [p for p in map(self.partial.get, call.keys) if p not in self.resume]
            self.resume.extend(moved)
            self.counts["recovered"] += len(moved)
            return
        call.handle = self.rt.clients[call.instance].start(prompts, params)
        state.calls.append(call)
        threading.Thread(target=self._read, args=(call,), name=f"call-{call.keys[0]}", daemon=True).start()

    def _read(self, call: _Call) -> None:
        try:
            for sample in call.handle:
                self.events.put(("sample", call, sample))
        except BaseException as exc:  # noqa: BLE001 - surfaced on the orchestrator's thread (``_on_error``)
            self.events.put(("error", call, exc))

    # ------------------------------------------------------------------ collecting
    def _collect(self, timeout: float) -> None:
        drain(self.events, timeout, self._on_event, budget_s=self.COLLECT_BUDGET_S)

    def _on_event(self, event: tuple) -> None:
        kind, call, payload = event
        if kind == "error":
            self._on_error(call, payload)
        else:
            self._on_sample(call, payload)

    def _on_sample(self, call: _Call, s: SampleRecord) -> None:
        state = self.groups.get(call.group)
        if state is None or state.complete or call.handle.cancelled:
            return  # surplus of a finished, aborted or cancelled group
        call.open -= 1
        self.fleet.release(call.booked, 1)
        if self.dispatcher is not None:
            self.dispatcher.finished(state.estimate, 0 if s.finish_reason == "interrupted" else len(s.token_ids))
        pkey = call.keys[0] if len(call.keys) == 1 else f"{call.group}/{s.sample_index}"
        if s.finish_reason == "interrupted":
            p = self.partial.extend(pkey, s.token_ids, s.logprobs, s.weight_version)
            self.counts["interrupted"] += 1
            self.repack.interrupted(pkey)  # a migration's trajectory: now in transit to its destination
            if len(p.token_ids) < self.max_new:
                self.resume.append(p)
                return
            s = SampleRecord(s.prompt_id, s.group_id, s.sample_index, s.prompt_token_ids, (), (), s.weight_version,
                             "length", s.submitted_at, s.started_at, s.finished_at)
        self._finish_sample(state, self.partial.finish(pkey), s)

    def _on_error(self, call: _Call, exc: BaseException) -> None:
        address = self.rt.clients[call.instance].address
        unavailable = isinstance(exc, grpc.RpcError) and exc.code() == grpc.StatusCode.UNAVAILABLE
        if not unavailable:
            raise RuntimeError(f"SGS instance {call.instance} ({address}) failed: {exc}") from exc
        if self._holds_work(call.instance):
            self._lose_instance(call.instance, f"{address}: {exc.details()}")

    def _lose_instance(self, i: int, why: str) -> None:
        """Mark instance ``i`` dead (this thread saw it go); ``_resume_lost`` follows."""
        self.keeper.lost(i, why)

    def _resume_lost(self, i: int) -> None:
        """Instance ``i`` was lost (``keeper.notice``, once per loss, whichever thread marked it): resume its
        trajectories elsewhere from their recorded tokens."""
        log.warning("SGS instance %d lost; resuming its trajectories elsewhere", i)
        for state in self.groups.values():
            for call in state.calls:
                if call.instance == i and call.handle is not None and not call.handle.cancelled:
                    call.handle.cancel()
                    call.open = 0
        for p in self.partial.on_instance(i):
            if p not in self.resume:
                self.resume.append(p)
                self.counts["recovered"] += 1

    def _finish_sample(self, state: _GroupState, p: Partial, s: SampleRecord) -> None:
        """Stitch the segments of one trajectory into a SampleRecord of the original prompt."""
        self.repack.forget(p.key)  # it finished on the source before the Interrupt reached it
        version = p.first_version if p.first_version >= 0 else s.weight_version
        sample = SampleRecord(
            prompt_id=p.group, group_id=p.group, sample_index=p.sample_index, prompt_token_ids=p.prompt_token_ids,
            token_ids=p.token_ids + s.token_ids, logprobs=p.logprobs + s.logprobs, weight_version=version,
            finish_reason=s.finish_reason, submitted_at=s.submitted_at, started_at=s.started_at,
            finished_at=s.finished_at,
        )
        self.gen_busy.append((s.started_at, s.finished_at))
        if self.estimates is not None:
            self.estimates.finished(p.group, len(sample.token_ids))
            self._rework(state, p.group)
        state.finished[p.sample_index] = (sample, self.rt.score(sample))
        if len(state.finished) >= self.tc.group_size:
            self._complete(p.group, state)

    def _rework(self, state: _GroupState, key: str) -> None:
        """The group's finished siblings moved its estimate: its samples still running on the group's
        call are booked at the new one (the fleet table's ``work``, what dispatch balances)."""
        work = self.estimates.remaining_work(key)
        for call in state.calls:
            if work is not None and call.open and call.booked is not None and call.tag.startswith("group-"):
                call.booked = self.fleet.rework(call.booked, call.open, work)

    def _complete(self, key: str, state: _GroupState) -> None:
        state.complete = True
        self._cancel_calls(state)
        if self.estimates is not None:
            self.estimates.close(key, complete=True)
        done = sorted(state.finished.items())[: self.tc.group_size]
        samples = [s for _, (s, _) in done]
        outcomes = [f.result() for _, (_, f) in done]  # scored while the group's other samples ran
        self.complete(key, samples, outcomes)

    def _cancel_calls(self, state: _GroupState) -> None:
        for call in state.calls:
            if call.open and call.handle is not None and not call.handle.cancelled:
                call.handle.cancel()
                self.fleet.release(call.booked, call.open)  # and their estimated work
                call.open = 0
        for p in self.partial.drop_group(state.problem.prompt_id):
            self.resume = [r for r in self.resume if r.key != p.key]
            self.repack.forget(p.key)

    # ------------------------------------------------------------------ training
    def published(self, out: Published) -> None:
        self.latest = (out.version, out.snapshot)
        self.stepped = True

    def busy_intervals(self) -> list[tuple[float, float]]:
        busy = self.gen_busy + open_call_intervals(self.groups.values(), time.time())
        self.gen_busy = []
        return busy

    def step_metrics(self, result: ConsumeResult, keys: list[str], groups: list[Group]) -> dict:
        entries = result.entries
        for key in keys:
            self.groups.pop(key, None)
        rows = self.fleet.snapshot().rows
        return {
            "inherent_staleness_mean": sum(e.inherent_staleness for e in entries) / len(entries),
            "instance_versions": [r.version for r in rows],
            "instance_groups": [r.placed for r in rows],  # groups launched there (resumes not counted)
            # by the address the trainer dials: False = lost (its trajectories resumed elsewhere)
            "instances_alive": {r.address: r.state in HOLDS_WORK for r in rows},
            **self.repack.metrics(),
            **(self.dispatcher.metrics() if self.dispatcher is not None else {}),
            **(self.estimates.metrics() if self.estimates is not None else {}),
        }

    def forget(self, key: str, reason: str) -> None:
        state = self.groups.pop(key, None)
        if self.estimates is not None:
            self.estimates.close(key, complete=False)
        if state is not None:
            state.complete = True
            self._cancel_calls(state)
            if reason == "async_bound":
                self.prompts.put_back(state.problem)  # regenerate it on fresher weights

    def shutdown(self) -> None:
        """Cancel work for buffers that will not be trained; bring every live instance to the newest
        version (the publisher offers to, and the end of the run waits for, the rows that hold work;
        evaluation picks among the live ones)."""
        # an instance that died with nothing in flight has not been noticed yet: ask every one now,
        # or the final offer (a unary PullWeights) and evaluation would fail on it
        try:
            self.repack.snapshot(self.rt.clients, self._up(), self._lose_instance)
        except RuntimeError as err:  # every instance is gone: keep the error that ended the run, if any
            log.error("at shutdown: %s", err)
        for state in self.groups.values():
            state.complete = True
            self._cancel_calls(state)
        version, state = self.latest
        if state is not None:  # not again where it went already (an evaluation between steps): a second push fails
            self.publisher.offer_missing(version, state)
