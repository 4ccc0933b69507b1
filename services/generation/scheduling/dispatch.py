"""Dispatch: which instance generates each sequence of a batch (StreamRL §5.3, Algorithm 2).

Every policy is a pure function ``(seqs, DispatchContext) -> DispatchPlan`` registered by name
(``register_dispatch``); the live router and the simulator call the same objects. The unit of
dispatch is one sample (``ctx.unit = "sample"``, the default: a GRPO group may span instances)
or one prompt's whole group (``"prompt"``: what engines with parallel sampling do, keeping the
shared prompt in one KV cache, and what the SGS did before the router); policies see a group
as one ``SeqRequest`` with ``count`` samples.

Baselines (need no length estimates):

- ``random`` — each sequence to a uniformly random instance (seeded);
- ``round_robin`` — in arrival order, cycling from ``ctx.rotation``;
- ``least_loaded`` — in arrival order, to the instance with the fewest outstanding sequences
  (already running there + assigned so far; ties: fewest prompt tokens assigned). On idle
  instances this is round-robin; it differs when instances carry unequal work.
- ``least_tokens`` — join the shortest queue by **tokens in flight**: to the instance holding the
  fewest tokens (its KV cache's and its queue's, measured and passed as ``InstanceLoad.tokens``),
  each assigned sequence counting its prompt plus the mean recent output length. The strongest
  length-blind policy when groups arrive while others run (on idle instances: ``least_loaded``).

Estimate-driven (estimates are first calibrated onto the recent length distribution,
``lengths.calibrate``):

- ``lpt`` — global LPT: longest estimate first, each to the instance with the least estimated
  outstanding work (Graham's rule across instances).
- ``streamrl_naive`` — Algorithm 2 as written: the top ``alpha`` by estimate are long-tail,
  L_long = P90(D), L_regular = P50(D), instance latency PTL(BS) x L_avg x ceil(M/BS) with a
  KV-bounded BS, the **sum** of the two groups' latencies minimised over N_long + N_regular = N,
  sequences spread evenly inside each group.
- ``streamrl`` — Algorithm 2 refined (measured in ``bench/dispatch.py``; the naive reading
  was slower than random there). Differences, each fixing a way the literal version
  misjudges long-tail work: (1) the objective is the **max** over instances (they run in
  parallel), not the sum; (2) an instance's latency comes from the event-driven instance
  model (``instance_model.run_instance``) fed with calibrated estimates, so it sees the
  tail — one 20K-token sample lasts 20K steps whatever the batch — which P90 x ceil(M/BS)
  cannot; (3) the long-tail fraction is searched over {alpha} and a few smaller fractions
  (the very longest samples are what need a dedicated, lightly loaded instance) together
  with N_long; "no long-tail instances" (= global LPT) is a candidate, so on the model's
  own estimate the refined policy is never worse than ``lpt``; (4) inside each group
  sequences are spread by LPT on estimated work rather than evenly; (5) with an
  ``EstimateErrorModel`` (recent estimate/actual pairs) each candidate is judged on
  ``scenarios`` draws of plausible true lengths rather than on the estimates themselves, so
  a weak ranker does not buy dedicated instances for samples that turn out short while the
  real long ones crowd the regular instances.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from services.generation.scheduling.admission import Order
from services.generation.scheduling.cost import InstanceSpec
from services.generation.scheduling.instance_model import Job, run_instance
from services.generation.scheduling.lengths import EstimateErrorModel, LengthDistribution, calibrate
from services.generation.scheduling.types import DispatchPlan, InstanceLoad, SeqRequest

# Long-tail fractions the refined policy tries besides the configured alpha: the extreme tail
# of LLM outputs is a few percent of samples (StreamRL Fig. 7, Laminar Fig. 2).
REFINED_FRACTIONS: tuple[float, ...] = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2)


@dataclass(frozen=True)
class DispatchContext:
    """Everything a dispatch policy may use besides the sequences (plain data)."""

    instances: tuple[InstanceLoad, ...]
    spec: InstanceSpec | None = None  # cost model + limits of one instance (skewness-aware policies)
    lengths: LengthDistribution | None = None  # recent output lengths, tokens (D of Algorithm 2)
    alpha: float = 0.2  # long-tail fraction
    admission: Order = "lpt"  # admission order inside instances (what the refined policy models)
    errors: EstimateErrorModel | None = None  # the ranker's recent errors (estimate -> actual)
    scenarios: int = 3  # true-length draws per candidate in the refined policy (with ``errors``)
    seed: int = 0  # for ``random`` and the scenario draws
    rotation: int = 0  # first instance of ``round_robin``
    unit: Literal["sample", "prompt"] = "sample"  # dispatch each sample, or each prompt's group whole

    def __post_init__(self) -> None:
        if not self.instances:
            raise ValueError("dispatch needs at least one instance")
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.scenarios < 1:
            raise ValueError(f"scenarios must be >= 1, got {self.scenarios}")

    @property
    def n(self) -> int:
        return len(self.instances)


DispatchPolicy = Callable[[Sequence[SeqRequest], DispatchContext], DispatchPlan]
_POLICIES: dict[str, DispatchPolicy] = {}
NEEDS_ESTIMATES: set[str] = set()  # policies that use estimates (fall back to round_robin without)
NEEDS_COST: set[str] = set()  # policies that need ``ctx.spec``


def register_dispatch(
    name: str, *, estimates: bool = False, cost: bool = False
) -> Callable[[DispatchPolicy], DispatchPolicy]:
    def deco(fn: DispatchPolicy) -> DispatchPolicy:
        if name in _POLICIES:
            raise ValueError(f"dispatch policy {name!r} registered twice")
        _POLICIES[name] = fn
        if estimates:
            NEEDS_ESTIMATES.add(name)
        if cost:
            NEEDS_COST.add(name)
        return fn

    return deco


def policy_names() -> list[str]:
    return sorted(_POLICIES)


def dispatch(name: str, seqs: Sequence[SeqRequest], ctx: DispatchContext) -> DispatchPlan:
    """Run policy ``name``. Estimate-driven policies fall back to ``round_robin`` when no
    sequence has an estimate (the plan's ``notes['fallback']`` says so)."""
    if name not in _POLICIES:
        raise ValueError(f"unknown dispatch policy {name!r}; registered: {policy_names()}")
    if name in NEEDS_COST and ctx.spec is None:
        raise ValueError(f"dispatch policy {name!r} needs an instance cost model (a PTL profile)")
    if not seqs:
        return DispatchPlan({}, name)
    if ctx.unit == "prompt":
        return _by_prompt(name, seqs, ctx)
    if name in NEEDS_ESTIMATES and all(s.estimate is None for s in seqs):
        plan = _POLICIES["round_robin"](seqs, ctx)
        return DispatchPlan(plan.assignment, name, notes={"fallback": "round_robin (no estimates)"})
    return _POLICIES[name](seqs, ctx)


def _by_prompt(name: str, seqs: Sequence[SeqRequest], ctx: DispatchContext) -> DispatchPlan:
    """Dispatch each group (the samples of one prompt) whole: what engines with parallel
    sampling (vLLM's ``n``, prefix shared in the KV cache) and the pre-router SGS did."""
    members: dict[str, list[SeqRequest]] = {}
    for s in seqs:
        members.setdefault(s.group or s.seq_id, []).append(s)
    units = []
    for key, group in members.items():
        known = [s.estimate for s in group if s.estimate is not None]
        units.append(SeqRequest(key, group[0].prompt_tokens, sum(known) / len(known) if known else None,
                                group=key, count=sum(s.count for s in group)))
    plan = dispatch(name, units, replace(ctx, unit="sample"))
    return replace(
        plan,
        assignment={s.seq_id: plan.assignment[key] for key, group in members.items() for s in group},
        long_tail=frozenset(s.seq_id for key in plan.long_tail for s in members[key]),
        notes={**plan.notes, "unit": "prompt"},
    )


# ---------------------------------------------------------------------------- baselines
@register_dispatch("random")
def _random(seqs: Sequence[SeqRequest], ctx: DispatchContext) -> DispatchPlan:
    rng = random.Random(ctx.seed)
    return DispatchPlan({s.seq_id: rng.randrange(ctx.n) for s in seqs}, "random")


@register_dispatch("round_robin")
def _round_robin(seqs: Sequence[SeqRequest], ctx: DispatchContext) -> DispatchPlan:
    return DispatchPlan({s.seq_id: (ctx.rotation + i) % ctx.n for i, s in enumerate(seqs)}, "round_robin")


@register_dispatch("least_loaded")
def _least_loaded(seqs: Sequence[SeqRequest], ctx: DispatchContext) -> DispatchPlan:
    count = [inst.outstanding for inst in ctx.instances]
    prompt = [0] * ctx.n
    out: dict[str, int] = {}
    for s in seqs:
        i = min(range(ctx.n), key=lambda j: (count[j], prompt[j], j))
        out[s.seq_id] = i
        count[i] += s.count
        prompt[i] += s.prompt_tokens * s.count
    return DispatchPlan(out, "least_loaded")


def tokens_in_flight(state: tuple[float, int] | None, kv_tokens: int, outstanding: int, mean_length: float) -> float:
    """``least_tokens``' load of one instance: the tokens its KV cache holds (``state``: the fraction
    of its ``kv_tokens`` in use, samples queued) plus each queued sample at the mean recent output
    length; without a state (it did not answer), each of its ``outstanding`` samples at the mean."""
    if state is None:
        return outstanding * mean_length
    kv_usage, waiting = state
    return kv_usage * kv_tokens + waiting * mean_length


@register_dispatch("least_tokens")
def _least_tokens(seqs: Sequence[SeqRequest], ctx: DispatchContext) -> DispatchPlan:
    """Join the shortest queue by tokens in flight (length-blind): each unit goes to the instance
    with the fewest tokens (``InstanceLoad.tokens``, measured on the instance), which then counts
    the unit's prompt plus the mean recent output length (``ctx.lengths``; no per-prompt
    estimate) per sequence. Ties: fewer sequences outstanding, then the lower index."""
    tokens = [inst.tokens for inst in ctx.instances]
    count = [inst.outstanding for inst in ctx.instances]
    mean = ctx.lengths.mean() if ctx.lengths is not None else 0.0
    out: dict[str, int] = {}
    for s in seqs:
        i = min(range(ctx.n), key=lambda j: (tokens[j], count[j], j))
        out[s.seq_id] = i
        tokens[i] += s.count * (s.prompt_tokens + mean)
        count[i] += s.count
    return DispatchPlan(out, "least_tokens")


# ---------------------------------------------------------------------------- estimate-driven
def _calibrated(seqs: Sequence[SeqRequest], ctx: DispatchContext) -> list[float]:
    return calibrate([s.estimate for s in seqs], ctx.lengths, ctx.errors)


def _work(seqs: Sequence[SeqRequest], est: list[float]) -> list[float]:
    return [e * s.count for s, e in zip(seqs, est, strict=True)]


def _top_units(order: list[int], seqs: Sequence[SeqRequest], n_seqs: int) -> int:
    """How many units (longest first) make up the first ``n_seqs`` sequences."""
    total = 0
    for k, i in enumerate(order):
        if total >= n_seqs:
            return k
        total += seqs[i].count
    return len(order)


def _lpt_balance(order: list[int], work: list[float], bins: list[int], load: dict[int, float]) -> dict[int, int]:
    """Graham's LPT: items (indices into ``work``, longest first) to the least-loaded bin."""
    count = dict.fromkeys(bins, 0)
    out: dict[int, int] = {}
    for idx in order:
        b = min(bins, key=lambda j: (load[j], count[j], j))
        out[idx] = b
        load[b] += work[idx]
        count[b] += 1
    return out


def _by_estimate(est: list[float]) -> list[int]:
    return sorted(range(len(est)), key=lambda i: (-est[i], i))


@register_dispatch("lpt", estimates=True)
def _global_lpt(seqs: Sequence[SeqRequest], ctx: DispatchContext) -> DispatchPlan:
    work = _work(seqs, _calibrated(seqs, ctx))
    load = {inst.index: inst.outstanding_work for inst in ctx.instances}
    placed = _lpt_balance(_by_estimate(work), work, [inst.index for inst in ctx.instances], load)
    return DispatchPlan({seqs[i].seq_id: b for i, b in placed.items()}, "lpt")


def _eq2_latency(spec: InstanceSpec, m: int, l_avg: float, prompt: float) -> float:
    """StreamRL Eq. 2 for one instance: PTL(BS) x L_avg x ceil(M / BS), BS KV-bounded."""
    if m <= 0:
        return 0.0
    bs = min(m, spec.kv_bounded_batch(prompt, l_avg))
    return spec.cost.ptl(bs, prompt + l_avg / 2.0) * l_avg * math.ceil(m / bs)


@register_dispatch("streamrl_naive", estimates=True, cost=True)
def _streamrl_naive(seqs: Sequence[SeqRequest], ctx: DispatchContext) -> DispatchPlan:
    assert ctx.spec is not None
    est = _calibrated(seqs, ctx)
    dist = ctx.lengths or LengthDistribution(est)
    order = _by_estimate(est)
    total = sum(s.count for s in seqs)
    n_long = _top_units(order, seqs, int(ctx.alpha * total))
    long_idx, reg_idx = order[:n_long], order[n_long:]
    m_long, m_reg = sum(seqs[i].count for i in long_idx), sum(seqs[i].count for i in reg_idx)
    prompt = sum(s.prompt_tokens * s.count for s in seqs) / total
    best: tuple[float, int] | None = None
    for nl in range(1 if long_idx else 0, ctx.n if reg_idx else ctx.n + 1):
        nr = ctx.n - nl
        lat = 0.0
        if long_idx:
            lat += _eq2_latency(ctx.spec, math.ceil(m_long / nl), dist.p90, prompt)
        if reg_idx:
            lat += _eq2_latency(ctx.spec, math.ceil(m_reg / nr), dist.p50, prompt)
        if best is None or lat < best[0]:
            best = (lat, nl)
    assert best is not None
    nl = best[1]
    out: dict[str, int] = {}
    for k, i in enumerate(long_idx):
        out[seqs[i].seq_id] = ctx.instances[k % nl].index
    for k, i in enumerate(reg_idx):
        out[seqs[i].seq_id] = ctx.instances[nl + k % (ctx.n - nl)].index
    return DispatchPlan(
        out, "streamrl_naive", long_tail=frozenset(seqs[i].seq_id for i in long_idx),
        long_instances=tuple(inst.index for inst in ctx.instances[:nl]), predicted_makespan_s=best[0],
        notes={"n_long": nl, "long_fraction": ctx.alpha},
    )


def _scenarios(seqs: Sequence[SeqRequest], est: list[float], ctx: DispatchContext) -> list[list[float]]:
    """True-length scenarios to judge candidates on: draws from the error model, or the
    calibrated estimates themselves when there is none."""
    if ctx.errors is None:
        return [est]
    # one draw per group: the samples of one prompt are long or short together
    first: dict[str, int] = {}
    rep = [first.setdefault(s.group or s.seq_id, i) for i, s in enumerate(seqs)]
    heads = sorted(set(rep))
    draws = ctx.errors.scenarios([seqs[i].estimate or 0.0 for i in heads], ctx.scenarios, ctx.seed)
    out = []
    for draw in draws:
        value = dict(zip(heads, draw, strict=True))
        out.append([value[rep[i]] if s.estimate is not None else est[i] for i, s in enumerate(seqs)])
    return out


def _candidate(
    seqs: Sequence[SeqRequest], est: list[float], order: list[int], n_long_seqs: int, nl: int, ctx: DispatchContext,
    scenarios: list[list[float]],
) -> tuple[float, dict[int, int]]:
    """Assign the top ``n_long_seqs`` to the first ``nl`` instances and the rest to the others
    (LPT on estimated work in both groups); return (mean predicted makespan over the
    scenarios, index -> instance)."""
    assert ctx.spec is not None
    indices = [inst.index for inst in ctx.instances]
    load = {inst.index: inst.outstanding_work for inst in ctx.instances}
    long_bins, reg_bins = (indices[:nl], indices[nl:]) if nl else (indices, indices)
    work = _work(seqs, est)
    n_units = _top_units(order, seqs, n_long_seqs)
    placed = _lpt_balance(order[:n_units], work, long_bins, load)
    placed.update(_lpt_balance(order[n_units:], work, reg_bins, load))
    members: dict[int, list[int]] = {b: [] for b in indices}
    for i, b in placed.items():
        members[b].append(i)
    total = 0.0
    for lengths in scenarios:
        total += max(
            run_instance(
                [
                    Job(f"{seqs[i].seq_id}#{k}", seqs[i].prompt_tokens, max(1, round(lengths[i])), seqs[i].estimate)
                    for i in idx for k in range(seqs[i].count)
                ],
                ctx.spec, ctx.admission,
            ).makespan_s
            for idx in members.values() if idx
        )
    return total / len(scenarios), placed


@register_dispatch("streamrl", estimates=True, cost=True)
def _streamrl(seqs: Sequence[SeqRequest], ctx: DispatchContext) -> DispatchPlan:
    est = _calibrated(seqs, ctx)
    order = _by_estimate(est)
    scenarios = _scenarios(seqs, est, ctx)
    fractions = sorted({ctx.alpha, *REFINED_FRACTIONS})
    total = sum(s.count for s in seqs)
    sizes = sorted({max(1, round(f * total)) for f in fractions if round(f * total) < total})
    best_t, best_placed = _candidate(seqs, est, order, 0, 0, ctx, scenarios)
    best_cfg = (0, 0)
    for size in sizes if ctx.n > 1 else ():
        for nl in range(1, (ctx.n + 1) // 2 + 1):
            t, placed = _candidate(seqs, est, order, size, nl, ctx, scenarios)
            if t < best_t * (1 - 1e-9):
                best_t, best_placed, best_cfg = t, placed, (size, nl)
    size, nl = best_cfg
    return DispatchPlan(
        {seqs[i].seq_id: b for i, b in best_placed.items()}, "streamrl",
        long_tail=frozenset(seqs[i].seq_id for i in order[:_top_units(order, seqs, size)]) if nl else frozenset(),
        long_instances=tuple(inst.index for inst in ctx.instances[:nl]),
        predicted_makespan_s=best_t, notes={"n_long": nl, "long_seqs": size, "scenarios": len(scenarios)},
    )
