"""The orchestrator hands work to the learner; the learner hands versions back.

The orchestrator runs on its own thread, apart from the learner: it keeps routing, collecting,
scoring and syncing instances while the learner runs backward passes and optimizer steps. What
crosses between them is small and ordered:

- to the learner: groups to backward (the head buffer's, as they complete), then a ``StepOrder``
  for each consumed buffer (its groups, what the metrics row needs, the recovery state captured
  at the consume when a checkpoint is due);
- to the orchestrator: each new version's ``Published`` (its snapshot, for the instances).

A failure on either side ends the other: the orchestrator's exception is raised in the learner
at its next ``take``; a learner that stops closes the handoff, and the orchestrator's loop ends.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field

from services.rollout.staleness import ConsumeResult
from services.run.runtime import Published
from services.trainer.learner import Group


@dataclass
class StepOrder:
    """One consumed buffer, to be trained as the step from ``buffer_version`` to ``buffer_version + 1``."""

    iteration: int
    result: ConsumeResult
    groups: list[Group]
    staleness: list[list[int]]  # per group, per sample: what the metrics report (bounded by eta)
    reward_failures: int  # trained samples whose reward failed (trained with reward 0)
    extra: dict  # the workflow's metrics of the buffer
    gen_busy: list[tuple[float, float]] = field(default_factory=list)  # generation intervals not yet tallied
    checkpoint: dict | None = None  # the orchestrator's recovery state at the consume (when one is due)


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class Handoff:
    def __init__(self) -> None:
        self._to_learner: queue.Queue = queue.Queue()
        self._to_rollout: queue.Queue[Published] = queue.Queue()
        self.closed = threading.Event()  # the learner stopped (finished or failed)

    # ------------------------------------------------------------------ orchestrator side
    def backward(self, groups: list[Group]) -> None:
        if groups:
            self._to_learner.put(groups)

    def step(self, order: StepOrder) -> None:
        self._to_learner.put(order)

    def fail(self, exc: BaseException) -> None:
        self._to_learner.put(_Failed(exc))

    def published(self, timeout: float = 0.0) -> list[Published]:
        """The versions published since the last call (waiting up to ``timeout`` for the first)."""
        out = []
        try:
            out.append(self._to_rollout.get(timeout=timeout) if timeout > 0 else self._to_rollout.get_nowait())
            while True:
                out.append(self._to_rollout.get_nowait())
        except queue.Empty:
            return out

    # ------------------------------------------------------------------ learner side
    def take(self) -> list[Group] | StepOrder:
        """The next piece of work, in the order the orchestrator handed it over."""
        item = self._to_learner.get()
        if isinstance(item, _Failed):
            raise RuntimeError(f"the rollout orchestrator failed: {item.exc}") from item.exc
        return item

    def publish(self, out: Published) -> None:
        self._to_rollout.put(out)

    def close(self) -> None:
        self.closed.set()
