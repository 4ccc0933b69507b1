"""Streaming gradients of the staleness manager's head buffer, shared by the runners that use it.

The occupied entries of the head buffer are final (they leave it only by Consume or Abort), so
their gradients can be computed as they appear: ``train_head`` backwards them
``micro_batch_groups`` at a time (or the last ones that complete the batch), never more than the
``batch`` groups a step trains (with redundant groups, a surplus one is never trained). ``consume``
retires the Ready head buffer preferring the groups already trained, backwards the rest, and
returns what the step trains. ``backward`` hands groups to the learner (``services.rollout.handoff``), where gradients
accumulate until the step.
"""

from __future__ import annotations

from collections.abc import Callable

from services.rollout.pools import ExperienceBuffer
from services.rollout.staleness import ConsumeResult, Entry, StalenessManager
from services.trainer.learner import Group


class HeadTrainer:
    def __init__(self, mgr: StalenessManager, experience: ExperienceBuffer[Group],
                 backward: Callable[[list[Group]], None], micro_batch_groups: int, stream: bool = True) -> None:
        self.mgr, self.experience, self.backward, self.micro = mgr, experience, backward, micro_batch_groups
        self.stream = stream  # False: every backward waits for ``consume`` (the sequential baseline)
        self.trained: set[str] = set()

    def train_head(self) -> None:
        """Backward the head buffer's occupied groups as they appear."""
        if not self.stream:
            return
        new = [e.key for e in self.mgr.head_occupied() if e.key not in self.trained]
        room = self.mgr.batch - len(self.trained)  # with redundancy never train a surplus group
        new = new[: max(room, 0)]
        if new and (len(new) >= self.micro or len(new) == room):
            self.backward([self.experience.get(k) for k in new])
            self.trained.update(new)

    def _prefer_trained(self, occupied: list[Entry], n: int) -> list[Entry]:
        return sorted(occupied, key=lambda e: e.key not in self.trained)[:n]

    def consume(self) -> tuple[ConsumeResult, list[str], list[Group]]:
        """Consume the Ready head buffer: (the manager's result, its keys, their groups, every one backwarded)."""
        result = self.mgr.consume(select=self._prefer_trained)
        keys = [e.key for e in result.entries]
        groups = self.experience.take(keys)
        untrained = [g for key, g in zip(keys, groups, strict=True) if key not in self.trained]
        if untrained:
            self.backward(untrained)
        self.trained.clear()
        return result, keys, groups
