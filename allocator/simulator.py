"""Discrete-event simulation of SGS generation: dispatch, then continuous batching per instance.

``simulate`` answers "how long does this batch take on N instances under this policy?":

1. dispatch: the registered policy (``services.generation.scheduling.dispatch``) — the same
   function the live router calls — assigns every sequence to an instance, seeing only the
   *estimates* (ranker) or, in oracle mode, the true lengths passed as estimates;
2. per instance: ``run_instance`` (the event-driven model in
   ``services.generation.scheduling.instance_model``) admits sequences in the instance's
   admission order (``AdmissionQueue``, the SGS core's object: FCFS or LPT by estimate) under
   the batch limit and the KV-cache capacity, and advances decode steps with the profile's
   per-step cost (StaleFlow's T_i(S) = k1 kv + max(k2, k3 n) + k4, plus k5 n kv for the CPU
   engine), generating each sequence's **true** length;
3. the makespan is the latest finish over instances (all sequences arrive at t = 0); with
   ``cores`` (instances sharing that many CPU cores, as two SGS instances pinned to one core), the
   instances' runs are their CPU work and the makespan is that of processor sharing over the
   cores (``shared_makespan``): the instance model's decisions depend on counts and KV tokens,
   never on time, so each instance makes the same steps at whatever speed it gets.

The allocator issue's generation-time model is ``generation_time``: a workload (prompt and
output lengths, optional estimates) on ``n`` instances of one profile, with the configured
dispatch and admission, returns the simulated makespan. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from services.generation.scheduling import (
    DispatchContext,
    DispatchPlan,
    EstimateErrorModel,
    InstanceLoad,
    InstanceRun,
    InstanceSpec,
    Job,
    LengthDistribution,
    Order,
    SeqRequest,
    dispatch,
    run_instance,
)


@dataclass(frozen=True)
class SimSample:
    """One sequence of the workload: ``length`` = tokens it will really generate; ``estimate``
    = what the scheduler is told (None = unknown)."""

    seq_id: str
    prompt_tokens: int
    length: int
    estimate: float | None = None
    group: str = ""  # the prompt it samples (GRPO group); "" = on its own


@dataclass
class SimResult:
    makespan_s: float
    policy: str
    admission: str
    plan: DispatchPlan
    instances: list[InstanceRun] = field(default_factory=list)

    @property
    def instance_makespans(self) -> list[float]:
        return [r.makespan_s for r in self.instances]

    def tokens_per_s(self) -> float:
        return sum(r.tokens for r in self.instances) / self.makespan_s if self.makespan_s > 0 else 0.0


def simulate(
    samples: Sequence[SimSample],
    spec: InstanceSpec,
    n_instances: int,
    *,
    policy: str,
    admission: Order,
    lengths: LengthDistribution | None = None,
    errors: EstimateErrorModel | None = None,
    alpha: float = 0.2,
    seed: int = 0,
    scenarios: int = 3,
    oracle: bool = False,
    unit: str = "sample",
    trace: bool = False,
    cores: float | None = None,
) -> SimResult:
    """Dispatch ``samples`` with ``policy`` over ``n_instances`` identical instances and run
    each instance; ``oracle`` tells the scheduler the true lengths instead of the estimates
    (then pass no ``lengths``/``errors``: true lengths need no calibration). ``cores``: the
    instances share that many cores (None: each has its own)."""
    if n_instances < 1:
        raise ValueError(f"n_instances must be >= 1, got {n_instances}")
    if not samples:
        raise ValueError("simulate needs at least one sample")
    est = {s.seq_id: (float(s.length) if oracle else s.estimate) for s in samples}
    seqs = [SeqRequest(s.seq_id, s.prompt_tokens, est[s.seq_id], group=s.group) for s in samples]
    ctx = DispatchContext(
        instances=tuple(InstanceLoad(i) for i in range(n_instances)), spec=spec, lengths=lengths,
        alpha=alpha, admission=admission, errors=errors, scenarios=scenarios, seed=seed,
        unit=unit,  # type: ignore[arg-type]
    )
    plan = dispatch(policy, seqs, ctx)
    per_inst: list[list[Job]] = [[] for _ in range(n_instances)]
    for s in samples:
        per_inst[plan.assignment[s.seq_id]].append(Job(s.seq_id, s.prompt_tokens, s.length, est[s.seq_id]))
    runs = [run_instance(jobs, spec, admission, trace=trace) for jobs in per_inst]
    works = [r.makespan_s for r in runs]
    makespan = max(works) if cores is None else shared_makespan(works, cores)
    return SimResult(makespan, policy, admission, plan, runs)


def shared_makespan(works: Sequence[float], cores: float) -> float:
    """When the last of ``works`` (seconds of one core each, all ready at t = 0, each on one
    thread) ends under processor sharing over ``cores`` cores: k busy instances each run at
    min(1, cores / k). One core: the sum of the works; as many cores as works: the largest."""
    if cores <= 0:
        raise ValueError(f"cores must be > 0, got {cores}")
    left = sorted(w for w in works if w > 0)
    t = done = 0.0
    for k, w in enumerate(left):
        rate = min(1.0, cores / (len(left) - k))  # each of the len(left) - k still busy
        t += (w - done) / rate
        done = w
    return t


def generation_time(
    prompt_tokens: Sequence[int],
    output_tokens: Sequence[int],
    spec: InstanceSpec,
    n_instances: int,
    *,
    policy: str = "round_robin",
    admission: Order = "fcfs",
    estimates: Sequence[float | None] | None = None,
    lengths: LengthDistribution | None = None,
    alpha: float = 0.2,
    seed: int = 0,
) -> float:
    """Simulated seconds to generate one batch (the allocator's T_gen for x instances)."""
    if len(prompt_tokens) != len(output_tokens):
        raise ValueError(f"{len(prompt_tokens)} prompt lengths for {len(output_tokens)} output lengths")
    ests = list(estimates) if estimates is not None else [None] * len(output_tokens)
    samples = [
        SimSample(f"s{i}", int(p), int(o), e)
        for i, (p, o, e) in enumerate(zip(prompt_tokens, output_tokens, ests, strict=True))
    ]
    return simulate(samples, spec, n_instances, policy=policy, admission=admission, lengths=lengths,
                    alpha=alpha, seed=seed).makespan_s


@dataclass(frozen=True)
class MeasuredInstance:
    """One instance's share of a measured run: the jobs it generated (true lengths, the
    estimates its admission queue saw), its admission order and its measured makespan (s)."""

    jobs: tuple[Job, ...]
    admission: Order
    measured_s: float


def calibrate_spec(spec: InstanceSpec, runs: Sequence[MeasuredInstance]) -> tuple[InstanceSpec, dict]:
    """Fit the profile's step cost to measured per-instance makespans of a short run.

    The instance model's decisions (admission, preemption) depend on counts and KV tokens,
    never on time, so scaling every term of the step cost (k1..k5, prefill) by ``s`` scales
    every simulated makespan by exactly ``s``: the fit is closed-form, the geometric mean of
    measured / simulated over the runs (least squares on log makespans). It corrects what a
    profile measured elsewhere gets wrong as a whole (another host's speed, RPC and polling
    overheads, CPU sharing); the shape of the cost (batch, KV dependence) stays the
    profile's. Returns (calibrated spec, {"scale", "runs", "fit_error"}) where ``fit_error``
    is the mean |simulated / measured - 1| on the calibration runs themselves (not an
    out-of-sample error: evaluate the spec on other runs)."""
    import math
    from dataclasses import replace

    used = [r for r in runs if r.jobs and r.measured_s > 0]
    if not used:
        raise ValueError("calibrate_spec needs at least one measured instance with jobs and a positive makespan")
    sims = [run_instance(list(r.jobs), spec, r.admission).makespan_s for r in used]
    if any(s <= 0 for s in sims):
        raise ValueError("the profile simulates a zero makespan; cannot scale it")
    logs = [math.log(r.measured_s / s) for r, s in zip(used, sims, strict=True)]
    scale = math.exp(sum(logs) / len(logs))
    c = spec.cost
    cost = replace(c, k1=c.k1 * scale, k2=c.k2 * scale, k3=c.k3 * scale, k4=c.k4 * scale, k5=c.k5 * scale,
                   prefill_per_token=c.prefill_per_token * scale, per_sequence=c.per_sequence * scale)
    fit_error = sum(abs(s * scale / r.measured_s - 1) for r, s in zip(used, sims, strict=True)) / len(used)
    return replace(spec, cost=cost), {"scale": scale, "runs": len(used), "fit_error": fit_error}
