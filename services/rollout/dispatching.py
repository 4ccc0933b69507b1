"""Skewness-aware placement of new groups: the dispatch policies, in the orchestrator.

When the orchestrator dials the SGS instances and a length estimator is configured
(``generation.ranker_dir``), the groups that can start in one routing round are placed together by
``generation.dispatch.policy`` — the same pure functions the SGS router and the simulators call
(``services.generation.scheduling.dispatch``), each group whole — over the instances the
staleness protocol allows them (those of the version they were reserved at, in the task's pool),
given each instance's samples in flight and estimated outstanding work, the recent output lengths
and the estimator's recent errors (estimate -> actual). Each group's estimate travels with its
prompt, so the instance admits the longest first (LPT). Without an estimator the orchestrator's
staleness-aware least-loaded pick stands, the best length-blind choice.

Mechanism around a pure call: the estimator is injected (``predict(texts)``, e.g. the ranker
store's ``RankerWatcher(root).get()``, hot-swapped), and a failing estimator costs estimates,
never the run.
"""

from __future__ import annotations

import itertools
import logging
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
    def __init__(self, gen, n: int, estimator: Callable[[], LengthEstimator | None],
                 spec: InstanceSpec | None = None, version: Callable[[], str | None] | None = None,
                 probe: Callable[[int], tuple[float, int] | None] | None = None) -> None:
        self.cfg, self.dcfg = gen, gen.dispatch
        self.estimator, self.spec = estimator, spec
        # ``least_tokens``: instance index -> (KV-cache fraction in use, samples queued), None if it did not answer
        self.probe = probe
        self.kv_tokens = gen.num_blocks * gen.page_size
        self.version = version  # the estimator's name (a ranker store's live version), for the metrics
        self.work = [0.0] * n  # estimated output tokens outstanding per instance
        self.lengths = LengthWindow(self.dcfg.length_window)
        self.pairs: deque[tuple[float, float]] = deque(maxlen=self.dcfg.length_window)
        self.failures = 0  # estimator calls that raised
        self.placed = 0  # groups placed by the policy
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

    def given(self, values: list[float | None]) -> list[float | None]:
        """Estimates from elsewhere (a replay's recorded ones, or the true lengths), counted as the
        estimator's are (a missing or non-positive value is no estimate)."""
        out = [float(v) if v is not None and v > 0 else None for v in values]
        self.estimated += sum(1 for v in out if v is not None)
        return out

    def tokens_in_flight(self, instance: int, outstanding: int) -> float:
        """Tokens on ``instance`` now (``least_tokens``' load, ``dispatch.tokens_in_flight``)."""
        lengths = self.lengths.distribution(self.dcfg.min_history)
        state = self.probe(instance) if self.probe is not None else None
        return tokens_in_flight(state, self.kv_tokens, outstanding, lengths.mean() if lengths is not None else 0.0)

    def place(self, groups: list[NewGroup], candidates: list[InstanceView]) -> dict[str, int]:
        """Each group's instance (an index of ``candidates``' instances) by the dispatch policy."""
        if not groups:
            return {}
        measured = self.dcfg.policy == "least_tokens"
        loads = tuple(InstanceLoad(k, v.inflight, self.work[v.index],
                                   self.tokens_in_flight(v.index, v.inflight) if measured else 0.0)
                      for k, v in enumerate(candidates))
        pairs = list(self.pairs)
        ctx = DispatchContext(
            instances=loads, spec=self.spec, lengths=self.lengths.distribution(self.dcfg.min_history),
            alpha=self.dcfg.alpha, admission=self.cfg.admission,
            errors=EstimateErrorModel(pairs) if len(pairs) >= self.dcfg.min_history else None,
            scenarios=self.dcfg.scenarios, seed=next(self._seeds),
            rotation=min(range(len(loads)), key=lambda k: (loads[k].outstanding, k)),
        )
        seqs = [SeqRequest(g.key, g.prompt_tokens, g.estimate, group=g.key, count=g.samples) for g in groups]
        plan = dispatch(self.dcfg.policy, seqs, ctx)
        self.placed += len(groups)
        return {key: candidates[k].index for key, k in plan.assignment.items()}

    def launched(self, instance: int, estimate: float | None, samples: int) -> None:
        self.work[instance] += (estimate or 0.0) * samples

    def finished(self, instance: int, estimate: float | None, length: int) -> None:
        """A sample placed with ``estimate`` on ``instance`` finished with ``length`` tokens."""
        self.work[instance] = max(0.0, self.work[instance] - (estimate or 0.0))
        if length > 0:
            self.lengths.add(length)
            if estimate is not None:
                self.pairs.append((estimate, float(length)))

    def metrics(self) -> dict:
        return {"dispatch_policy": self.dcfg.policy, "dispatched_groups": self.placed,
                "estimated_groups": self.estimated, "estimator_failures": self.failures,
                **({"ranker_version": self.version()} if self.version is not None else {})}

    def plan_round(self, groups: list[NewGroup], first: list[InstanceView], eligible: list[list[int] | None],
                   views: list[InstanceView], capacity: int) -> dict[str, int]:
        """The instance of each group of one routing round. ``first``: where the staleness-aware pick
        put it (its version is the group's ``V_traj``); ``eligible``: its task's instances (None = any).
        A group moves only among the live instances of its version and pool, and never past an
        instance's ``capacity``; with fewer than two such instances it stays where it was picked."""
        classes: dict[tuple[int, tuple[int, ...] | None], list[int]] = {}
        for k, (inst, allowed) in enumerate(zip(first, eligible, strict=True)):
            classes.setdefault((inst.version, None if allowed is None else tuple(allowed)), []).append(k)
        targets: dict[str, int] = {}
        added = [0] * len(views)
        for (version, allowed), ks in classes.items():
            candidates = [v for v in views if v.alive and v.version == version and (allowed is None or v.index in allowed)]
            placed = self.place([groups[k] for k in ks], candidates) if len(candidates) > 1 else {}
            for k in ks:
                g = groups[k]
                t = placed.get(g.key, first[k].index)
                if views[t].inflight + added[t] + g.samples > capacity:
                    t = first[k].index  # the policy over-filled it: keep the pick's instance, which had room
                targets[g.key] = t
                added[t] += g.samples
        return targets
