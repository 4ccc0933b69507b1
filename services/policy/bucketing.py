"""How the learner splits sequences into micro-batches: pure, no torch, so the allocator's
training model (``allocator.padding``) prices exactly what the learner computes."""

from __future__ import annotations

from collections.abc import Sequence

MICRO_BATCH_TOKENS = 4096  # the learner's padded tokens per forward/backward: bounds activation memory


def length_buckets(lengths: Sequence[int], max_tokens: int = MICRO_BATCH_TOKENS) -> list[list[int]]:
    """Split indices into micro-batches of similar length, each with at most ``max_tokens``
    padded tokens (a single longer sequence gets a micro-batch of its own). Sorting by length
    first keeps padding waste small when lengths are long-tailed."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    buckets: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # sorted ascending: the newest member is the longest, so it sets the padded width
        if current and (len(current) + 1) * lengths[i] > max_tokens:
            buckets.append(current)
            current = []
        current.append(i)
    if current:
        buckets.append(current)
    return buckets
