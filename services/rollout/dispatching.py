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
from services.rollout.routing import InstanceView

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
    start in."""

    def __init__(self, dispatcher: GroupDispatcher, replay=None) -> None:
        self.dispatcher, self.replay = dispatcher, replay
        self._of: dict[str, float | None] = {}  # drawn groups' estimates, until they are placed

    def of(self, problems: list) -> list[float | None]:
        todo = [p for p in problems if p.prompt_id not in self._of]
        if todo:
            if self.replay is not None and self.replay.mode != "none":
                values = self.dispatcher.given([self.replay.estimate(p.prompt_id) for p in todo])
            else:
                values = self.dispatcher.estimates([p.prompt for p in todo])
            self._of.update(zip((p.prompt_id for p in todo), values, strict=True))
        return [self._of[p.prompt_id] for p in problems]

    def take(self, problems: list) -> list[float | None]:
        """The estimates of groups being placed (forgotten here: placement carries them on)."""
        out = self.of(problems)
        for p in problems:
            self._of.pop(p.prompt_id, None)
        self.dispatcher.estimated += sum(1 for v in out if v is not None)  # counted as placed
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
