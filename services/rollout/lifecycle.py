"""The group lifecycle every workflow shares: reserve, occupy or filter, consume, step.

A GRPO group's life is the same whether its members are single-turn samples
(``services.rollout.orchestrator``) or multi-turn trajectories (``services.rollout.agentic``):
it is *reserved* in the staleness manager when it starts, *occupied* when ``group_size`` of its
members finished (DAPO's dynamic sampling may abort it instead), and *consumed* with the Ready
head buffer: one optimizer step, version + 1, the weights copied out. ``GroupLifecycle`` owns that
part (the manager, the experience buffer, the head trainer, the counters, the iteration loop and
the step); a workflow subclass says how members start and come back (``tick``), what a consumed
group's metrics are (``step_metrics``) and how to let go of an aborted group (``forget``).

Modes are values of eta (``services.rollout.modes``): the loop is the same for all of them.
"""

from __future__ import annotations

import copy
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from services.common.types import SampleRecord
from services.rollout.handoff import Handoff, StepOrder
from services.rollout.head import HeadTrainer
from services.rollout.modes import eta_of, streams_training
from services.rollout.pools import ExperienceBuffer
from services.rollout.reward_shuffle import shuffle_rewards, shuffled_count
from services.rollout.rewards import Outcome
from services.rollout.staleness import ConsumedEntry, ConsumeResult, StalenessManager
from services.run.runtime import Accumulator, Published, TrainerRuntime
from services.trainer.algorithms import dapo_keep_group
from services.trainer.learner import Group


def outcomes_of(group: Group) -> list[Outcome]:
    """A trained group's samples as outcomes for the tally (its failures were counted when it completed)."""
    correct = group.correct if group.correct is not None else [r == 1.0 for r in group.rewards]
    return [Outcome(r, c) for r, c in zip(group.rewards, correct, strict=True)]


def staleness_metrics(entries: list[ConsumedEntry], eta: int) -> dict:
    """One consumed buffer's staleness: StaleFlow's histogram (Fig. 18) and the bound check."""
    hist = Counter(e.staleness for e in entries)
    return {
        "entry_staleness_hist": {str(s): n for s, n in sorted(hist.items())},
        "entry_staleness_max": max(e.staleness for e in entries),
        "bound_violations": sum(1 for e in entries if e.version + eta < e.buffer_version),
    }


def drain(events: queue.Queue, timeout: float, handle: Callable[[tuple], None], budget_s: float | None = None,
          clock: Callable[[], float] = time.perf_counter) -> None:
    """Wait up to ``timeout`` for the first event, then handle every event already queued; with
    ``budget_s``, stop once handling has taken that long (the rest waits for the next call, in
    order), so a queue that streams refill faster than it empties does not hold the loop."""
    try:
        event = events.get(timeout=timeout)
    except queue.Empty:
        return
    start = clock()
    while True:
        handle(event)
        if budget_s is not None and clock() - start >= budget_s:
            return
        try:
            event = events.get_nowait()
        except queue.Empty:
            return


@dataclass
class LoopClock:
    """The orchestrator loop's own cost between two hand-overs: its ticks, the rollout thread's CPU
    in them (``time.thread_time``: waits excluded) and the wall time since the last hand-over. On
    an EMULATED run this is the control plane's share: ``busy`` near 1 means the loop, not the
    modelled fleet, set the pace."""

    ticks: int = 0
    cpu_s: float = 0.0
    longest_cpu_s: float = 0.0
    since: float = field(default_factory=time.perf_counter)

    def tick(self, run: Callable[[], None]) -> None:
        c0 = time.thread_time()
        run()
        spent = time.thread_time() - c0
        self.ticks += 1
        self.cpu_s += spent
        self.longest_cpu_s = max(self.longest_cpu_s, spent)

    def take(self) -> dict[str, float]:
        """This interval's metrics; the clock starts the next one."""
        wall = time.perf_counter() - self.since
        out = {"orchestrator_ticks": self.ticks, "orchestrator_cpu_s": self.cpu_s,
               "orchestrator_busy": self.cpu_s / wall if wall > 0 else 0.0,
               "orchestrator_tick_cpu_ms_mean": 1000 * self.cpu_s / self.ticks if self.ticks else 0.0,
               "orchestrator_tick_cpu_ms_max": 1000 * self.longest_cpu_s}
        self.ticks, self.cpu_s, self.longest_cpu_s, self.since = 0, 0.0, 0.0, time.perf_counter()
        return out


class GroupLifecycle:
    """The iteration loop over the staleness manager; subclasses are the workflows.

    ``run`` starts the workflow on the orchestrator's thread (``_orchestrate``: tick until the head
    buffer is Ready, consume it, hand the step over, go on) and trains on the caller's thread
    (``_learn``: backward what arrives, step each consumed buffer, publish). The workflow's state
    is the orchestrator thread's alone; ``version`` is the newest version it has seen published."""

    offer_on_step = True  # offer every new version to every instance (False: the workflow syncs lazily)
    TICK_WAIT_S = 0.02  # how long the orchestrator waits for a step it needs before it ticks again

    def __init__(self, rt: TrainerRuntime) -> None:
        tc = rt.cfg.trainer
        self.rt, self.tc = rt, tc
        self.eta = eta_of(tc)
        self.version = rt.version
        self.mgr = StalenessManager(self.eta, tc.prompts_per_iteration * tc.group_size, tc.group_size,
                                    redundancy=tc.redundancy_groups, async_bound=tc.async_bound,
                                    start_version=rt.version, end_version=tc.iterations)
        self.experience: ExperienceBuffer[Group] = ExperienceBuffer()
        self.counts: Counter[str] = Counter()
        self.failures_of: dict[str, int] = {}  # occupied group -> its samples whose reward failed (trained as 0)
        self.handoff = Handoff()
        self.clock = LoopClock()

    def start_head(self) -> None:
        """The head trainer over the (possibly restored) manager; sequential holds every backward
        until the batch is complete."""
        self.head = HeadTrainer(self.mgr, self.experience, self.handoff.backward, self.tc.micro_batch_groups,
                                stream=streams_training(self.tc))

    # ------------------------------------------------------------------ what a workflow says
    def tick(self) -> None:
        """One round of the workflow while the head buffer fills: start, collect, backward."""
        raise NotImplementedError

    def before_step(self) -> None:
        """The head buffer is Ready, its step is next (start work that should run during it)."""

    def published(self, out: Published) -> None:
        """A new version's snapshot exists (``out``)."""

    def step_metrics(self, result: ConsumeResult, keys: list[str], groups: list[Group]) -> dict:
        """The workflow's extra metrics of one consumed buffer (and its bookkeeping of them)."""
        return {}

    def busy_intervals(self) -> list[tuple[float, float]]:
        """Generation intervals to count in the step's idle time besides its trained samples'."""
        return []

    def forget(self, key: str, reason: str) -> None:
        """Group ``key`` left the manager (aborted for ``reason``): stop its work, drop its state."""

    def checkpoint_state(self) -> dict:
        """The workflow's part of a recovery checkpoint (its data cursor under ``sampler``)."""
        return {"sampler": self.rt.sampler.state()}

    def shutdown(self) -> None:
        """The run ends: cancel work that will not be trained."""

    def staleness_of(self, result: ConsumeResult, sample: SampleRecord) -> int:
        return result.buffer_version - sample.weight_version

    # ------------------------------------------------------------------ the shared part
    def run(self, iterations: int, progress: Callable[[int, dict], None] | None = None) -> None:
        """Iterations ``version .. iterations - 1`` (a resumed runtime starts at its checkpoint's)."""
        first = self.rt.version
        if hasattr(self.rt.learner, "probe"):  # a learner process: what its death puts at risk (nothing is lost)
            self.rt.learner.probe = self.at_risk
        thread = threading.Thread(target=self._orchestrate, args=(first, iterations), name="rollout", daemon=True)
        thread.start()
        try:
            self._learn(first, iterations, progress)
        finally:
            self.handoff.close()
            thread.join(timeout=120)
        if thread.is_alive():
            raise RuntimeError("the rollout orchestrator did not stop within 120 s of the last step")
        self.rt.publisher.wait(self.rt.version)

    def at_risk(self) -> dict:
        """The groups the orchestrator holds now (read from the learner's thread: counts only)."""
        tracked, buffered = self.mgr.tracked_count(), len(self.experience)
        return {"tracked_groups": tracked, "buffered_groups": buffered, "in_flight_groups": tracked - buffered}

    def _orchestrate(self, first: int, iterations: int) -> None:
        try:
            for k in range(first, iterations):
                while not self.mgr.ready():
                    self._see_published(0.0)
                    self.clock.tick(self.tick)
                    self._check_learner()
                self.before_step()
                self._hand_over(k)
            while self.version < iterations:  # the last step's weights, for the shutdown's sync
                self._see_published(self.TICK_WAIT_S)
                if self.handoff.closed.is_set():  # the learner publishes before it stops: take what it left
                    self._see_published(0.0)
                    break
        except BaseException as exc:  # noqa: BLE001 - raised in the learner's thread
            self.handoff.fail(exc)
        finally:
            try:
                self.shutdown()
            except BaseException as exc:  # noqa: BLE001
                self.handoff.fail(exc)

    def _check_learner(self) -> None:
        if self.handoff.closed.is_set():
            raise RuntimeError("the learner stopped")

    def _see_published(self, timeout: float) -> None:
        for out in self.handoff.published(timeout):
            self.version = out.version
            self.published(out)

    def waiting_for_a_step(self) -> bool:
        """A consumed buffer's weights are not published yet (what can start next may need them)."""
        return self.version < self.mgr.head

    def complete(self, key: str, samples: list[SampleRecord], outcomes: list[Outcome]) -> bool:
        """``group_size`` members of ``key`` finished: occupy it, or abort it when DAPO's filter
        drops it (every reward equal). Returns whether it was kept. With ``reward.shuffle_fraction``
        the group's rewards may be permuted within it here, before any advantage is computed
        (``services.rollout.reward_shuffle``); correctness stays each sample's own."""
        rewards = [o.reward for o in outcomes]
        if self.tc.algorithm.dynamic_sampling and not dapo_keep_group(rewards):
            self.mgr.abort(key, "filtered")
            self.counts["filtered"] += 1
            self.forget(key, "filtered")
            return False
        rc = self.rt.cfg.reward
        rewards = shuffle_rewards(key, rewards, rc.shuffle_fraction, rc.shuffle_seed)
        self.experience.put(key, Group(samples, rewards, [o.correct for o in outcomes]))
        self.failures_of[key] = sum(1 for o in outcomes if o.failure)
        self.mgr.occupy(key, generated_version=min(s.weight_version for s in samples))
        return True

    def abort(self, key: str, reason: str) -> None:
        """Give a group up (its members failed for good)."""
        self.mgr.abort(key, reason)
        self._drop(key, reason)

    def _drop(self, key: str, reason: str) -> None:
        self.counts[f"aborted_{reason}"] += 1
        self.failures_of.pop(key, None)
        self.forget(key, reason)
        if key in self.experience:
            self.experience.take([key])

    def _hand_over(self, k: int) -> None:
        """Consume the Ready head buffer and hand its step to the learner (on the orchestrator's thread)."""
        result, keys, groups = self.head.consume()
        for a in result.aborted:  # batch-level redundancy surplus, async-bound victims
            self._drop(a.key, a.reason)
        staleness = [[self.staleness_of(result, s) for s in g.samples] for g in groups]
        failures = sum(self.failures_of.pop(key, 0) for key in keys)  # among the samples this step trains
        rc = self.rt.cfg.reward
        extra = {"eta": self.eta, "buffer_version": result.buffer_version,
                 "reward_shuffled_groups": shuffled_count(keys, rc.shuffle_fraction, rc.shuffle_seed),
                 **staleness_metrics(result.entries, self.eta), **self.step_metrics(result, keys, groups)}
        extra |= dict(sorted(self.counts.items())) | self.clock.take()
        # the state a checkpoint of the step's version holds, copied now: this thread goes on changing it
        due = self.rt.recovery_due(result.buffer_version + 1)
        self.handoff.step(StepOrder(k, result, groups, staleness, failures, extra, self.busy_intervals(),
                                    copy.deepcopy(self.checkpoint_state()) if due else None))

    def _learn(self, first: int, iterations: int, progress: Callable[[int, dict], None] | None) -> None:
        """Backward what the orchestrator hands over; step each consumed buffer (the caller's thread)."""
        self.rt.learner.begin()
        t_start = time.time()
        for _ in range(first, iterations):
            while not isinstance(order := self.handoff.take(), StepOrder):
                self.rt.learner.backward(order)
            row, t_start = self._step(order, t_start)
            if progress is not None:
                progress(order.iteration, row)
            if self.rt.evaluations.stop is not None:  # eval.stop_on_forgetting: a suite was forgotten
                break

    def _step(self, order: StepOrder, t_start: float) -> tuple[dict, float]:
        """The step, its metrics row, and when the next iteration's time starts: after the suites
        evaluated between the steps (``services.run.evaluations``), which neither iteration counts."""
        stats = self.rt.learner.stats
        out = self.rt.step_and_snapshot(stats, offer=self.offer_on_step, consumed=order.groups)
        self.handoff.publish(out)
        acc = Accumulator()
        for g, ages in zip(order.groups, order.staleness, strict=True):
            for s, o, age in zip(g.samples, outcomes_of(g), ages, strict=True):
                self.rt.tally(s, o, age, acc)
        acc.reward_failures = order.reward_failures
        self.rt.gen_busy.extend(order.gen_busy)
        t_end = time.time()
        evaluated = self.rt.evaluations.between_steps(out.version, out.snapshot)
        row = self.rt.record(order.iteration, t_start, t_end, acc, stats, out.grad_norm, out.stall_s,
                             order.extra | evaluated)
        self.rt.learner.begin()
        if order.checkpoint is not None:
            self.rt.save_recovery(order.checkpoint)
        return row, t_end + evaluated.get("suite_eval_s", 0.0)
