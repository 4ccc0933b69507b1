"""Event-driven model of one continuous-batching instance (pure; the simulator's core).

Given the sequences dispatched to an instance, its cost model and limits, compute when each
finishes. The same function serves two callers: the discrete-event simulator
(``allocator.simulator``: true lengths, to predict a makespan) and the refined StreamRL
dispatch policy (estimated lengths, to compare candidate assignments).

Mechanics (continuous batching as in vLLM and transformers' CB, decode-dominated):

- Admission: waiting sequences enter in ``AdmissionQueue`` order (FCFS or LPT — the object
  the live SGS core uses) while fewer than ``max_batch`` run and the KV cache holds their
  tokens below ``(1 - watermark) x capacity``; an idle instance always admits one.
  Admitting sequences costs ``StepCost.prefill`` (per prompt token and per sequence).
- Every step, each running sequence produces one token and its KV grows by one token; a step
  costs ``StepCost.step(n, kv)``. Between events (a completion, a KV overflow) n is constant
  and KV grows linearly, so the model jumps from event to event with the closed-form sum
  (``StepCost.steps``): O(events log n), fast enough for thousands of sequences.
- KV overflow (the running sequences outgrow the cache): the most recently admitted sequence
  is preempted (vLLM's recompute / transformers' offload): it leaves with its progress, goes
  to the head of the queue, pays the prefill of prompt + generated tokens again when
  readmitted, and nothing new is admitted until a sequence finishes.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from services.generation.scheduling.admission import AdmissionQueue, Order
from services.generation.scheduling.cost import InstanceSpec


@dataclass(frozen=True)
class Job:
    """A sequence as the instance model sees it: ``length`` tokens to generate (true lengths
    when simulating, estimates when planning), ``estimate`` = its admission key."""

    seq_id: str
    prompt_tokens: int
    length: int
    estimate: float | None = None


@dataclass
class InstanceRun:
    makespan_s: float
    start_s: dict[str, float]
    finish_s: dict[str, float]
    steps: int
    tokens: int
    preemptions: int
    max_running: int
    trace: list[tuple[float, int, int]] = field(default_factory=list)  # (t, running, kv tokens) at events


@dataclass
class _Run:
    job: Job
    generated0: int  # tokens generated before this admission (a resumed sequence)
    step0: int  # instance step counter at admission
    alive: bool = True

    def finish_step(self) -> int:
        return self.step0 + self.job.length - self.generated0

    def generated(self, step: int) -> int:
        return self.generated0 + (step - self.step0)


def run_instance(
    jobs: Sequence[Job], spec: InstanceSpec, order: Order, *, start_s: float = 0.0, trace: bool = False
) -> InstanceRun:
    """Run ``jobs`` (all queued at ``start_s``) to completion on one instance."""
    for j in jobs:
        if j.length < 1 or j.prompt_tokens < 0:
            raise ValueError(f"job {j.seq_id!r}: length must be >= 1 and prompt_tokens >= 0 (got {j.length}, {j.prompt_tokens})")
    cost = spec.cost
    queue: AdmissionQueue[tuple[Job, int]] = AdmissionQueue(order, lambda item: item[0].estimate)
    for j in jobs:
        queue.push((j, 0))
    admit_limit = spec.kv_capacity_tokens * (1.0 - spec.watermark)
    t, step = start_s, 0
    held = 0  # KV tokens held by running sequences at the current step
    finishing: list[tuple[int, int, _Run]] = []  # (finish step, admission index, run)
    stack: list[_Run] = []  # running, in admission order (preemption takes the newest)
    n = admissions = preemptions = tokens = max_running = 0
    blocked = False  # after a preemption, admit nothing until a sequence finishes
    out = InstanceRun(0.0, {}, {}, 0, 0, 0, 0)
    while True:
        prefill = admitted = 0
        while queue and n < spec.max_batch and not blocked:
            job, gen0 = queue.peek()  # type: ignore[misc]
            need = job.prompt_tokens + gen0
            if n > 0 and held + need > admit_limit:
                break
            queue.pop()
            run = _Run(job, gen0, step)
            heapq.heappush(finishing, (run.finish_step(), admissions, run))
            stack.append(run)
            admissions += 1
            n += 1
            held += need
            prefill += need
            admitted += 1
            out.start_s.setdefault(job.seq_id, t)
        if admitted:
            t += cost.prefill(prefill, admitted)
        max_running = max(max_running, n)
        if trace:
            out.trace.append((t, n, held))
        if n == 0:
            break
        while not finishing[0][2].alive:
            heapq.heappop(finishing)
        k = finishing[0][0] - step
        room = spec.kv_capacity_tokens - held  # tokens the cache can still take
        if n > 1 and n * k > room:  # the running sequences outgrow the cache within k steps
            k_safe = max(0, room // n)
            t += cost.steps(n, held, k_safe)
            step += k_safe
            held += n * k_safe
            tokens += n * k_safe
            victim = stack.pop()
            while not victim.alive:
                victim = stack.pop()
            victim.alive = False
            gen = victim.generated(step)
            held -= victim.job.prompt_tokens + gen
            n -= 1
            preemptions += 1
            queue.push((victim.job, gen), resumed=True)
            blocked = True
            continue
        t += cost.steps(n, held, k)
        step += k
        held += n * k
        tokens += n * k
        while finishing and finishing[0][0] <= step:
            _, _, run = heapq.heappop(finishing)
            if not run.alive:
                continue
            run.alive = False
            held -= run.job.prompt_tokens + run.job.length
            n -= 1
            blocked = False
            out.finish_s[run.job.seq_id] = t
        while stack and not stack[-1].alive:
            stack.pop()
    out.makespan_s = t - start_s
    out.steps, out.tokens, out.preemptions, out.max_running = step, tokens, preemptions, max_running
    return out
