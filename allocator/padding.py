"""What the learner really computes for a batch: its padded micro-batches (pure policy).

The trainer (``services.run.loop``) hands the learner complete groups as they finish,
``trainer.micro_batch_groups`` at a time (``DynamicBatcher``; the remainder at the end of the
iteration), and each ``Learner.backward`` call splits its sequences (prompt + response) into
micro-batches of similar length (``services.policy.bucketing.length_buckets``: sorted by length,
at most ``MICRO_BATCH_TOKENS`` padded tokens each, a longer sequence alone) and right-pads each
micro-batch to its longest sequence. Every matmul then runs on ``size x width`` tokens and the
attention on ``size x width^2`` positions, whatever the real lengths.

- ``micro_batch_work(calls)``: exactly that, when the sequence lengths of each ``backward``
  call are known (the profiler's and the bench's batches).
- ``expected_work(lengths, group_size, micro_batch_groups)``: when only the lengths of one
  batch are known (a workload's draws: the allocator's planning), the expectation over
  groupings: the lengths are dealt into groups of ``group_size``, the groups complete in order
  of their longest sequence (generation finishes a group with its longest sample), go to
  ``backward`` ``micro_batch_groups`` at a time and are bucketed as above; averaged over
  ``draws`` seeded deals (deterministic). The responses to one prompt have similar lengths, so
  the deal is correlated (``deal_groups``: a Gaussian copula; ``GROUP_CORRELATION``): real
  groups are more uniform than random ones, and a call of early groups holds only short
  sequences. Dealt at random (correlation 0) the count-down batches' padding comes out
  1.80-2.04x against 1.58-1.88x measured; at 0.68, 1.58-1.75x.

``length_buckets`` and ``MICRO_BATCH_TOKENS`` are the learner's own (``services.policy.bucketing``,
torch-free). No I/O.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from services.policy.bucketing import MICRO_BATCH_TOKENS, length_buckets

EXPECTED_DRAWS = 16  # random groupings averaged by expected_work
# Within-group correlation of log response lengths (intraclass correlation: the share of their
# variance between prompts): median over 194 iterations of two recorded 100-iteration count-down
# runs of the default config (bench/e2e.py's sync and one_step; quartiles 0.62-0.74), the
# iterations of bench/results/train_profile.lengths.json left out. mmlu-pro-cot's 8 models
# answering one question: 0.45.
GROUP_CORRELATION = 0.68


@dataclass(frozen=True)
class PaddedWork:
    """Real and padded work of one optimizer step (floats: ``expected_work`` averages)."""

    sequences: float
    tokens: float  # real prompt + response tokens
    attn_sq: float  # sum over sequences of length^2
    padded_tokens: float  # sum over micro-batches of size x width
    padded_attn_sq: float  # sum over micro-batches of size x width^2
    micro_batches: float
    longest: int  # the longest sequence

    @property
    def pad_factor(self) -> float:
        """Padded / real tokens (1.0: no padding)."""
        return self.padded_tokens / self.tokens if self.tokens else 1.0


def micro_batch_work(calls: Sequence[Sequence[int]], max_tokens: int = MICRO_BATCH_TOKENS) -> PaddedWork:
    """The work of ``backward`` calls of the given sequence lengths (prompt + response each)."""
    n = tokens = padded = mbs = longest = 0
    attn = padded_attn = 0.0
    for call in calls:
        for bucket in length_buckets(call, max_tokens):
            width = max(call[i] for i in bucket)
            padded += len(bucket) * width
            padded_attn += float(len(bucket) * width * width)
            mbs += 1
            longest = max(longest, width)
        n += len(call)
        tokens += sum(call)
        attn += float(sum(x * x for x in call))
    return PaddedWork(n, tokens, attn, padded, padded_attn, mbs, longest)


def backward_calls(groups: Sequence[Sequence[int]], micro_batch_groups: int) -> list[list[int]]:
    """Groups (sequence lengths each, in completion order) -> the sequence lengths of each
    ``backward`` call: ``micro_batch_groups`` groups at a time, the remainder last."""
    if micro_batch_groups < 1:
        raise ValueError(f"micro_batch_groups must be >= 1, got {micro_batch_groups}")
    return [[n for g in groups[i:i + micro_batch_groups] for n in g] for i in range(0, len(groups), micro_batch_groups)]


def completion_order(groups: Sequence[Sequence[int]]) -> list[list[int]]:
    """Groups in the order generation completes them: by their longest sequence (stable)."""
    return sorted((list(g) for g in groups), key=max)


def deal_groups(lengths: Sequence[int], group_size: int, rng: random.Random,
                correlation: float = 0.0) -> list[list[int]]:
    """``lengths`` dealt into groups of ``group_size`` (a remainder joins the last group) whose
    members' lengths correlate by ``correlation`` (0: at random; 1: each group a run of the
    sorted lengths): a Gaussian copula, each slot's latent ``sqrt(c) z_group + sqrt(1 - c)
    e_slot``, the sorted lengths handed out in the latents' order."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if not 0.0 <= correlation <= 1.0:
        raise ValueError(f"correlation must be in [0, 1], got {correlation}")
    n = len(lengths)
    sizes = [group_size] * max(1, n // group_size)
    sizes[-1] += n - sum(sizes)
    a, b = math.sqrt(correlation), math.sqrt(1.0 - correlation)
    slots: list[tuple[float, float, int]] = []
    for g, size in enumerate(sizes):
        z = rng.gauss(0.0, 1.0)
        slots += [(a * z + b * rng.gauss(0.0, 1.0), rng.random(), g) for _ in range(size)]
    groups: list[list[int]] = [[] for _ in sizes]
    for length, (_, _, g) in zip(sorted(lengths), sorted(slots), strict=True):
        groups[g].append(length)
    for group in groups:
        rng.shuffle(group)
    return [g for g in groups if g]


def expected_work(lengths: Sequence[int], group_size: int, micro_batch_groups: int, *,
                  correlation: float = GROUP_CORRELATION, max_tokens: int = MICRO_BATCH_TOKENS,
                  draws: int = EXPECTED_DRAWS, seed: int = 0) -> PaddedWork:
    """The mean work of one step over ``lengths`` (prompt + response of every sequence of the
    batch) when only the lengths are known: correlated groups in completion order (module
    docstring)."""
    if not lengths:
        raise ValueError("expected_work needs at least one sequence")
    rng = random.Random(seed)
    works = [micro_batch_work(backward_calls(completion_order(deal_groups(lengths, group_size, rng, correlation)),
                                             micro_batch_groups), max_tokens) for _ in range(max(1, draws))]

    def mean(name: str) -> float:
        return sum(getattr(w, name) for w in works) / len(works)

    return PaddedWork(len(lengths), float(sum(lengths)), float(sum(x * x for x in lengths)), mean("padded_tokens"),
                      mean("padded_attn_sq"), mean("micro_batches"), max(lengths))
