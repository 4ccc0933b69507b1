"""Skewness-aware placement of new groups: the dispatch policies, in the orchestrator.

When the orchestrator dials the SGS instances and a length estimator is configured
(``generation.ranker_dir``), the groups that can start in one routing round are placed together by
``generation.dispatch.policy`` — the same pure functions the SGS router and the simulators call
(``services.generation.scheduling.dispatch``), each group whole — over the instances the
staleness protocol allows them (those of the version they were reserved at, in the task's pool),
given each instance's samples in flight and estimated outstanding work (the fleet table's ``work``,
read from the views), the recent output lengths and the estimator's recent errors (estimate ->
actual). Each group's estimate travels with its
prompt, so the instance admits the longest first (LPT); ``GroupEstimates`` also puts each batch of
prompts in LPT order before any of it starts (a step's long groups start while the instances have
room). Without an estimator the orchestrator's staleness-aware least-loaded pick stands, unless a
length-blind policy (e.g. ``least_tokens``: fewest tokens in flight) is asked for by name.

Mechanism around a pure call: the estimator is injected (``predict(texts)``, e.g. the ranker
store's ``RankerWatcher(root).get()``, hot-swapped), and a failing estimator costs estimates,
never the run.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ranker.metrics import recall_at
from services.generation.scheduling import (
    DispatchContext,
    EstimateErrorModel,
    InstanceLoad,
    InstanceSpec,
    LengthWindow,
    SeqRequest,
    dispatch,
)
from services.generation.scheduling.admission import AdmissionQueue
from services.generation.scheduling.dispatch import tokens_in_flight
from services.generation.scheduling.lengths import LengthEstimator
from services.generation.scheduling.run_signals import RunLengths, identity
from services.rollout.routing import InstanceView

if TYPE_CHECKING:
    from services.run.runtime import TrainerRuntime

log = logging.getLogger("braid.rollout")


@dataclass(frozen=True)
class NewGroup:
    key: str
    prompt_tokens: int
    estimate: float | None
    samples: int


class GroupDispatcher:
    def __init__(self, gen, estimator: Callable[[], LengthEstimator | None],
                 spec: InstanceSpec | None = None, version: Callable[[], str | None] | None = None,
                 probe: Callable[[int], tuple[float, int] | None] | None = None) -> None:
        self.cfg, self.dcfg = gen, gen.dispatch
        self.estimator, self.spec = estimator, spec
        # ``least_tokens``: instance index -> (KV-cache fraction in use, samples queued), None if it did not answer
        self.probe = probe
        self.kv_tokens = gen.num_blocks * gen.page_size
        self.version = version  # the estimator's name (a ranker store's live version), for the metrics
        self.lengths = LengthWindow(self.dcfg.length_window)
        self.pairs: deque[tuple[float, float]] = deque(maxlen=self.dcfg.length_window)
        self.failures = 0  # estimator calls that raised
        self.placed = 0  # groups placed by the policy
        self.plan_s = 0.0  # wall seconds in the policy (the orchestrator's thread waits them out)
        self.estimated = 0  # groups with an estimate
        self._seeds = itertools.count(self.dcfg.seed)

    def estimates(self, texts: list[str]) -> list[float | None]:
        """One estimate per prompt text (None where the estimator has none or fails)."""
        model = self.estimator()
        if model is None or not texts:
            return [None] * len(texts)
        try:
            values = list(model.predict(texts))
        except Exception:
            self.failures += 1
            log.exception("length estimator failed; %d groups placed without estimates", len(texts))
            return [None] * len(texts)
        if len(values) != len(texts):
            raise RuntimeError(f"length estimator returned {len(values)} estimates for {len(texts)} prompts")
        return self.given(values)

    @staticmethod
    def given(values: list[float | None]) -> list[float | None]:
        """Estimates from elsewhere (a replay's recorded ones, or the true lengths), cleaned as the
        estimator's are (a missing or non-positive value is no estimate)."""
        return [float(v) if v is not None and v > 0 else None for v in values]

    def tokens_in_flight(self, instance: int, outstanding: int, mean_length: float) -> float:
        """Tokens on ``instance`` now (``least_tokens``' load, ``dispatch.tokens_in_flight``)."""
        state = self.probe(instance) if self.probe is not None else None
        return tokens_in_flight(state, self.kv_tokens, outstanding, mean_length)

    def place(self, groups: list[NewGroup], candidates: list[InstanceView]) -> dict[str, int]:
        """Each group's instance (an index of ``candidates``' instances) by the dispatch policy."""
        if not groups:
            return {}
        lengths = self.lengths.distribution(self.dcfg.min_history)  # sorted once per round
        mean = lengths.mean() if lengths is not None else 0.0
        measured = self.dcfg.policy == "least_tokens"
        loads = tuple(InstanceLoad(k, v.inflight, v.work,
                                   self.tokens_in_flight(v.index, v.inflight, mean) if measured else 0.0)
                      for k, v in enumerate(candidates))
        pairs = list(self.pairs)
        ctx = DispatchContext(
            instances=loads, spec=self.spec, lengths=lengths,
            alpha=self.dcfg.alpha, admission=self.cfg.admission,
            errors=EstimateErrorModel(pairs) if len(pairs) >= self.dcfg.min_history else None,
            scenarios=self.dcfg.scenarios, seed=next(self._seeds),
            rotation=min(range(len(loads)), key=lambda k: (loads[k].outstanding, k)),
        )
        seqs = [SeqRequest(g.key, g.prompt_tokens, g.estimate, group=g.key, count=g.samples) for g in groups]
        t0 = time.perf_counter()
        plan = dispatch(self.dcfg.policy, seqs, ctx)
        self.plan_s += time.perf_counter() - t0
        self.placed += len(groups)
        return {key: candidates[k].index for key, k in plan.assignment.items()}

    def finished(self, estimate: float | None, length: int) -> None:
        """A sample placed with ``estimate`` finished with ``length`` tokens (the recent lengths and the
        estimator's errors). Its estimated work is the fleet table's: booked with the group's samples
        (``Fleet.reserve(work=estimate)``) and released with each one."""
        if length > 0:
            self.lengths.add(length)
            if estimate is not None:
                self.pairs.append((estimate, float(length)))

    def metrics(self) -> dict:
        return {"dispatch_policy": self.dcfg.policy, "dispatched_groups": self.placed, "dispatch_plan_s": self.plan_s,
                "estimated_groups": self.estimated, "estimator_failures": self.failures,
                **({"ranker_version": self.version()} if self.version is not None else {})}

    def plan_round(self, groups: list[NewGroup], first: list[InstanceView], eligible: list[list[int] | None],
                   views: list[InstanceView], capacity: int) -> dict[str, int]:
        """The instance of each group of one routing round. ``first``: where the staleness-aware pick
        put it (its version is the group's ``V_traj``); ``eligible``: its task's instances (None = any).
        A group moves only among the live instances of its version and pool that have room for it now,
        and never past an instance's ``capacity``; with fewer than two such instances it stays where it
        was picked. (A full instance is no candidate: a plan that put groups there would be overruled,
        and at fleet scale planning over every instance costs Algorithm 2 most of its time: when a step's
        later groups start one by one as earlier ones finish, one or two instances have room.)"""
        classes: dict[tuple[int, tuple[int, ...] | None], list[int]] = {}
        for k, (inst, allowed) in enumerate(zip(first, eligible, strict=True)):
            classes.setdefault((inst.version, None if allowed is None else tuple(allowed)), []).append(k)
        targets: dict[str, int] = {}
        added = [0] * len(views)
        for (version, allowed), ks in classes.items():
            need = min(groups[k].samples for k in ks)
            candidates = [v for v in views if v.alive and v.version == version
                          and (allowed is None or v.index in allowed) and v.inflight + need <= capacity]
            placed = self.place([groups[k] for k in ks], candidates) if len(candidates) > 1 else {}
            for k in ks:
                g = groups[k]
                t = placed.get(g.key, first[k].index)
                if views[t].inflight + added[t] + g.samples > capacity:
                    t = first[k].index  # the policy over-filled it: keep the pick's instance, which had room
                targets[g.key] = t
                added[t] += g.samples
        return targets


class GroupEstimates:
    """Length estimates of the groups drawn from the task — a replay's (recorded or true lengths)
    or the dispatcher's estimator's — computed once per group, and the order a task batch's groups
    start in. With ``run`` (``generation.dispatch.run_signals``) that estimate is the prior of the
    run's own: the prompt's lengths in its earlier visits of this run, and the group's finished
    samples as they come (``finished``, ``close``); ``metrics`` reports its recall@20% of group
    makespans over the recent closed groups."""

    def __init__(self, dispatcher: GroupDispatcher, replay=None, run: RunLengths | None = None,
                 size: int = 1, window: int = 256) -> None:
        self.dispatcher, self.replay, self.run, self.size = dispatcher, replay, run, size
        self._of: dict[str, float | None] = {}  # drawn groups' estimates, until they are placed
        self._prior: dict[str, float | None] = {}  # and the prior each was made from
        self._started: dict[str, float | None] = {}  # placed groups' estimates, until they close
        self.scored: deque[tuple[float, float]] = deque(maxlen=window)  # (estimate, makespan) of closed groups
        self.revisits = 0  # groups placed whose prompt had an earlier visit in this run

    def of(self, problems: list) -> list[float | None]:
        todo = [p for p in problems if p.prompt_id not in self._of]
        if todo:
            if self.replay is not None and self.replay.mode != "none":
                priors = self.dispatcher.given([self.replay.estimate_for(p, self.size) for p in todo])
            else:
                priors = self.dispatcher.estimates([p.prompt for p in todo])
            for p, prior in zip(todo, priors, strict=True):
                self._prior[p.prompt_id] = prior
                self._of[p.prompt_id] = self.run.sample(identity(p), prior) if self.run is not None else prior
        return [self._of[p.prompt_id] for p in problems]

    def take(self, problems: list) -> list[float | None]:
        """The estimates of groups being placed (forgotten here: placement carries them on); with run
        signals each group starts being followed."""
        out = self.of(problems)
        for p, estimate in zip(problems, out, strict=True):
            self._of.pop(p.prompt_id, None)
            prior = self._prior.pop(p.prompt_id, None)
            if self.run is not None:
                ident = identity(p)
                self.revisits += self.run.visits(ident) > 0
                self.run.start(p.prompt_id, ident, self.size, prior)
                self._started[p.prompt_id] = estimate
        self.dispatcher.estimated += sum(1 for v in out if v is not None)  # counted as placed
        return out

    def finished(self, key: str, length: int) -> None:
        """A sample of group ``key`` finished with ``length`` tokens (the whole trajectory)."""
        if self.run is not None:
            self.run.finished(key, length)

    def remaining_work(self, key: str) -> float | None:
        """The expected length of each of a running group's unfinished samples now (their mean, from
        its finished siblings), None without run signals or when nothing is known."""
        if self.run is None or key not in self._started:
            return None
        rest = self.run.remaining(key)
        return sum(rest) / len(rest) if rest else None

    def close(self, key: str, complete: bool) -> None:
        """Group ``key`` is done (``complete``: its lengths become its prompt's history and score the
        estimate) or dropped (a part of a group, its shortest, would bias the history: forgotten)."""
        if self.run is None or key not in self._started:
            return
        estimate = self._started.pop(key)
        if complete:
            makespan = self.run.makespan(key)
            if estimate is not None and makespan is not None:
                self.scored.append((estimate, makespan))
            self.run.close(key)
        else:
            self.run.discard(key)

    def metrics(self) -> dict:
        if self.run is None:
            return {}
        out = {"run_signals_revisits": self.revisits, "run_signals_sigma": self.run.sigma}
        if len(self.scored) >= 10:
            est, actual = zip(*self.scored, strict=True)
            out["run_signals_recall_at_20"] = recall_at(est, actual, 0.2)
        return out

    def launch_order(self, batch: Callable[[int], list]) -> Callable[[int], list]:
        """``batch`` with each batch longest estimate first (``AdmissionQueue("lpt")``, the instances'
        own rule: groups without an estimate first, in the task's order), so a step's long groups
        start while the instances have room rather than last."""
        def ordered(n: int) -> list:
            items = batch(n)
            est = dict(zip((p.prompt_id for p in items), self.of(items), strict=True))
            queue = AdmissionQueue("lpt", lambda p: est[p.prompt_id])
            queue.extend(items)
            return list(queue)

        return ordered


def group_estimates(dispatcher: GroupDispatcher | None, replay, own, size: int,
                    max_tokens: int) -> GroupEstimates | None:
    """Each new group's estimate when there is a dispatcher: the ranker's or a replay's, and with
    ``own.enabled`` (``generation.dispatch.run_signals``) the run's own on top of it."""
    if dispatcher is None:
        return None
    run = (RunLengths(decay=own.decay, prior_weight=own.prior_weight, sigma=own.sigma, min_groups=own.min_groups,
                      max_tokens=max_tokens) if own.enabled else None)
    return GroupEstimates(dispatcher, replay, run, size, own.recall_window)


def dispatches(cfg, behind: int) -> bool:
    """Whether the orchestrator places new groups by a dispatch policy (``build_dispatcher``) rather
    than by its least-loaded pick alone: it dials the instances itself and has length estimates
    (``generation.ranker_dir``, or a replay's) or the policy needs none."""
    from services.generation.scheduling.dispatch import NEEDS_ESTIMATES

    gen = cfg.generation
    replayed = cfg.forced_length_replay.estimates != "none"
    own = gen.dispatch.run_signals.enabled
    return behind <= 1 and bool(gen.ranker_dir or replayed or own or gen.dispatch.policy not in NEEDS_ESTIMATES)


def build_dispatcher(trainer: TrainerRuntime, behind: int) -> GroupDispatcher | None:
    """The dispatch policy over new groups when the orchestrator dials the instances (however many:
    more may join) and it has length estimates (``generation.ranker_dir``, or a replay's recorded or
    true lengths) or the policy needs none (a length-blind policy asked for by name); None otherwise:
    the staleness-aware least-loaded pick places every group."""
    from services.generation.scheduling.dispatch import NEEDS_COST

    gen = trainer.cfg.generation
    if not dispatches(trainer.cfg, behind):
        return None
    spec = None
    if gen.dispatch.policy in NEEDS_COST:
        from services.generation.router_main import load_spec

        spec = load_spec(gen, trainer.model_dir)
    clients = trainer.clients  # the list itself: it is edited in place when instances join or leave
    probe = (lambda i: clients[i].kv_state()) if gen.dispatch.policy == "least_tokens" else None
    if not gen.ranker_dir:
        return GroupDispatcher(gen, lambda: None, spec, probe=probe)
    from ranker.store import RankerWatcher

    watcher = RankerWatcher(gen.ranker_dir)
    return GroupDispatcher(gen, watcher.get, spec, version=lambda: watcher.name, probe=probe)
