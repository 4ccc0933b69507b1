"""Dynamic batching of a sample stream into GRPO micro-batches (pure policy).

Samples arrive one by one in completion order. GRPO needs a whole group to compute
advantages, so samples are held per group until all ``group_size`` have arrived; complete
groups queue up and a micro-batch is released as soon as ``micro_batch_groups`` of them are
ready (StreamRL §3's dynamic-batch pipelining: the trainer starts computing while the long
tail is still generating). ``flush`` releases the remainder at the end of an iteration.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from services.common.types import SampleRecord


@dataclass
class DynamicBatcher:
    group_size: int
    micro_batch_groups: int
    _partial: dict[str, list[SampleRecord]] = field(default_factory=lambda: defaultdict(list))
    _ready: list[list[SampleRecord]] = field(default_factory=list)
    groups_completed: int = 0

    def add(self, sample: SampleRecord) -> list[list[SampleRecord]] | None:
        """Add one sample; return a micro-batch (a list of complete groups) when one is due."""
        group = self._partial[sample.group_id]
        if any(s.sample_index == sample.sample_index for s in group):
            raise ValueError(f"duplicate sample {sample.sample_index} of group {sample.group_id!r}")
        group.append(sample)
        if len(group) == self.group_size:
            del self._partial[sample.group_id]
            self._ready.append(sorted(group, key=lambda s: s.sample_index))
            self.groups_completed += 1
        if len(self._ready) >= self.micro_batch_groups:
            batch, self._ready = self._ready, []
            return batch
        return None

    def flush(self) -> list[list[SampleRecord]] | None:
        """Release the complete groups still held (partial groups stay: see ``incomplete``)."""
        if not self._ready:
            return None
        batch, self._ready = self._ready, []
        return batch

    @property
    def incomplete(self) -> int:
        """Groups with some but not all samples received."""
        return len(self._partial)
