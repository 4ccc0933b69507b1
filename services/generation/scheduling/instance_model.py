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


class _Instance:
    """Mutable state of one simulated instance; ``run_instance`` drives it event by event."""

    def __init__(self, jobs: Sequence[Job], spec: InstanceSpec, order: Order, start_s: float, trace: bool) -> None:
        self.spec, self.cost = spec, spec.cost
        self.queue: AdmissionQueue[tuple[Job, int]] = AdmissionQueue(order, lambda item: item[0].estimate)
        for j in jobs:
            self.queue.push((j, 0))
        self.admit_limit = spec.kv_capacity_tokens * (1.0 - spec.watermark)
        self.t, self.step, self.held = start_s, 0, 0  # clock, step counter, KV tokens held by running sequences
        self.finishing: list[tuple[int, int, _Run]] = []  # (finish step, admission index, run)
        self.stack: list[_Run] = []  # running, in admission order (preemption takes the newest)
        self.n = self.admissions = 0
        self.blocked = False  # after a preemption, admit nothing until a sequence finishes
        self.trace = trace
        self.out = InstanceRun(0.0, {}, {}, 0, 0, 0, 0)

    def admit(self) -> None:
        prefill = admitted = 0
        while self.queue and self.n < self.spec.max_batch and not self.blocked:
            job, gen0 = self.queue.peek()  # type: ignore[misc]
            need = job.prompt_tokens + gen0
            if self.n > 0 and self.held + need > self.admit_limit:
                break
            self.queue.pop()
            run = _Run(job, gen0, self.step)
            heapq.heappush(self.finishing, (run.finish_step(), self.admissions, run))
            self.stack.append(run)
            self.admissions += 1
            self.n += 1
            self.held += need
            prefill += need
            admitted += 1
            self.out.start_s.setdefault(job.seq_id, self.t)
        if admitted:
            self.t += self.cost.prefill(prefill, admitted)
        self.out.max_running = max(self.out.max_running, self.n)
        if self.trace:
            self.out.trace.append((self.t, self.n, self.held))

    def advance(self, k: int) -> None:
        """Run ``k`` decode steps of the current batch."""
        self.t += self.cost.steps(self.n, self.held, k)
        self.step += k
        self.held += self.n * k
        self.out.tokens += self.n * k

    def preempt_newest(self) -> None:
        victim = self.stack.pop()
        while not victim.alive:
            victim = self.stack.pop()
        victim.alive = False
        gen = victim.generated(self.step)
        self.held -= victim.job.prompt_tokens + gen
        self.n -= 1
        self.out.preemptions += 1
        self.queue.push((victim.job, gen), resumed=True)
        self.blocked = True

    def retire_finished(self) -> list[str]:
        """Retire the sequences done by now; their ids."""
        done: list[str] = []
        while self.finishing and self.finishing[0][0] <= self.step:
            _, _, run = heapq.heappop(self.finishing)
            if not run.alive:
                continue
            run.alive = False
            self.held -= run.job.prompt_tokens + run.job.length
            self.n -= 1
            self.blocked = False
            self.out.finish_s[run.job.seq_id] = self.t
            done.append(run.job.seq_id)
        while self.stack and not self.stack[-1].alive:
            self.stack.pop()
        return done

    def steps_to_next_finish(self) -> int:
        while not self.finishing[0][2].alive:
            heapq.heappop(self.finishing)
        return self.finishing[0][0] - self.step

    def plan(self) -> tuple[int, bool] | None:
        """Admit, then plan the run to the next event: (decode steps to it, whether it is a KV
        overflow rather than a completion), or None when there is nothing to run."""
        self.admit()
        if self.n == 0:
            return None
        k = self.steps_to_next_finish()
        room = self.spec.kv_capacity_tokens - self.held  # tokens the cache can still take
        if self.n > 1 and self.n * k > room:  # the running sequences outgrow the cache within k steps
            return max(0, room // self.n), True
        return k, False

    def segment(self) -> list[str] | None:
        """Admit, then run to the next completion (or KV overflow); the sequences that finished, or
        None when there is nothing to run."""
        planned = self.plan()
        if planned is None:
            return None
        k, overflow = planned
        self.advance(k)
        if overflow:
            self.preempt_newest()
            return []
        return self.retire_finished()

    def remove(self, seq_id: str) -> int | None:
        """Drop a queued or running sequence (cancelled, interrupted): the tokens it generated so
        far, or None when it is not here. Its KV is freed, so admission resumes."""
        queued = self.queue.remove_if(lambda item: item[0].seq_id == seq_id)
        if queued:
            return queued[0][1]
        for i, run in enumerate(self.stack):
            if run.alive and run.job.seq_id == seq_id:
                run.alive = False  # its entry in ``finishing`` is skipped when it comes up
                del self.stack[i]
                gen = run.generated(self.step)
                self.held -= run.job.prompt_tokens + gen
                self.n -= 1
                self.blocked = False
                return gen
        return None


def _check(jobs: Sequence[Job]) -> None:
    for j in jobs:
        if j.length < 1 or j.prompt_tokens < 0:
            raise ValueError(
                f"job {j.seq_id!r}: length must be >= 1 and prompt_tokens >= 0 (got {j.length}, {j.prompt_tokens})"
            )


def run_instance(
    jobs: Sequence[Job], spec: InstanceSpec, order: Order, *, start_s: float = 0.0, trace: bool = False
) -> InstanceRun:
    """Run ``jobs`` (all queued at ``start_s``) to completion on one instance."""
    _check(jobs)
    inst = _Instance(jobs, spec, order, start_s, trace)
    while inst.segment() is not None:
        pass
    out = inst.out
    out.makespan_s, out.steps = inst.t - start_s, inst.step
    return out


@dataclass(frozen=True)
class Segment:
    """The open segment of a ``SteppedInstance`` (work-clock seconds): its decode steps start at
    ``start_s`` (after the admission's prefill) and reach the next event at ``end_s``, ``steps``
    steps later; the event is a completion, or a KV overflow when ``preempts``."""

    start_s: float
    steps: int
    end_s: float
    preempts: bool


class SteppedInstance:
    """One instance driven segment by segment, with jobs arriving between segments: the model of
    ``run_instance`` for a caller that decides what arrives when (``allocator.launch_sim``: the
    orchestrator launching groups as earlier ones complete). ``t`` is the instance's own work
    clock: the seconds of compute its segments took, whatever share of a core it gets.

    A live caller (``services.generation.emulated_engine``) also cuts segments short: ``open``
    admits and plans the next segment without running it, ``steps_done`` says how many of its
    decode steps a point on the work clock has reached, and ``close(k)`` runs only the first
    ``k`` (a new arrival joins at the next step boundary; a cancel or interrupt takes a sequence
    out with ``remove`` between segments). ``close()`` runs it all, as ``next_segment`` does."""

    def __init__(self, spec: InstanceSpec, order: Order) -> None:
        self._inst = _Instance((), spec, order, 0.0, False)
        self._open: tuple[Segment, int, int] | None = None  # (segment, running n, KV held) at its start

    def push(self, jobs: Sequence[Job]) -> None:
        _check(jobs)
        for j in jobs:
            self._inst.queue.push((j, 0))

    def next_segment(self) -> tuple[float, list[str]] | None:
        """Run the next segment: (its work in seconds, the sequences it finished), or None when idle."""
        if self._open is not None:
            raise RuntimeError("next_segment with a segment open: close it first")
        t0 = self._inst.t
        done = self._inst.segment()
        return None if done is None else (self._inst.t - t0, done)

    def open(self) -> Segment | None:
        """Admit what fits (paying its prefill) and plan the run to the next event without running
        it; None when there is nothing to run. The open segment until ``close``."""
        if self._open is not None:
            return self._open[0]
        planned = self._inst.plan()
        if planned is None:
            return None
        k, overflow = planned
        inst = self._inst
        seg = Segment(inst.t, k, inst.t + inst.cost.steps(inst.n, inst.held, k), overflow)
        self._open = (seg, inst.n, inst.held)
        return seg

    def steps_done(self, t: float, round_up: bool = False) -> int:
        """Decode steps of the open segment finished by work-clock time ``t`` (``round_up``: also
        the step in progress at ``t``); at most its ``steps``."""
        if self._open is None:
            raise RuntimeError("steps_done without an open segment")
        seg = self._open[0]
        lo, hi = 0, seg.steps  # the largest j with start + steps(j) <= t (cost.steps grows with j)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if seg.start_s + self.step_time(mid) <= t:
                lo = mid
            else:
                hi = mid - 1
        if round_up and lo < seg.steps and seg.start_s + self.step_time(lo) < t:
            lo += 1
        return lo

    def step_time(self, k: int) -> float:
        """Work seconds of the open segment's first ``k`` decode steps."""
        if self._open is None:
            raise RuntimeError("step_time without an open segment")
        _, n, held = self._open
        return self._inst.cost.steps(n, held, k)

    def close(self, steps: int | None = None) -> list[str]:
        """Run the open segment's first ``steps`` decode steps (None: all of them, then its event:
        the completions, or the preemption of the newest sequence); the sequences that finished."""
        if self._open is None:
            raise RuntimeError("close without an open segment")
        seg = self._open[0]
        self._open = None
        k = seg.steps if steps is None else steps
        if not 0 <= k <= seg.steps:
            raise ValueError(f"close({steps}): the open segment has {seg.steps} steps")
        self._inst.advance(k)
        if k < seg.steps:
            return []
        if seg.preempts:
            self._inst.preempt_newest()
            return []
        return self._inst.retire_finished()

    def remove(self, seq_id: str) -> int | None:
        """Take a queued or running sequence out (between segments): the tokens it generated, or
        None when the instance does not hold it."""
        if self._open is not None:
            raise RuntimeError("remove with a segment open: close it first")
        return self._inst.remove(seq_id)

    @property
    def running(self) -> int:
        return self._inst.n

    @property
    def work_s(self) -> float:
        """Compute seconds of the segments run so far (the work clock)."""
        return self._inst.t

    @property
    def kv_tokens(self) -> int:
        return self._inst.held

    @property
    def queued(self) -> int:
        return len(self._inst.queue)

    @property
    def run(self) -> InstanceRun:
        return self._inst.out
