"""Shuffled rewards: a sanity control that trains a share of groups on rewards that say nothing (pure).

With ``reward.shuffle_fraction = f`` > 0, a complete GRPO group is *shuffled* when
``u(reward.shuffle_seed, key) < f``, where ``u`` is a hash of the seed and the group's key (its prompt
id; an agentic group's key) mapped to [0, 1): about ``f`` of the groups, the same ones whatever the
timing, the mode or a resume, with no state to checkpoint. A shuffled group's rewards are permuted
*within the group* by a uniformly random permutation drawn from the same hash, before its
advantages are computed (``services.rollout.lifecycle.GroupLifecycle.complete``, the one place a
group's outcomes become what the learner trains on). The share is exact in expectation; over
``n`` groups the realised one is binomial (standard deviation ``sqrt(f (1 - f) / n)``), and every
step's count is in ``metrics.jsonl`` (``reward_shuffled_groups``).

Why within the group, uniformly: the permutation is drawn independently of the samples, so a
sample's reward no longer tells which sample was good, yet the group keeps its multiset of rewards.
Its advantages (GRPO: ``(r - mean) / std`` over the group; PPO: the outcome against a critic) keep
their set and scale, and only land on the wrong samples: the expected gradient of a shuffled group
is ``mean(A) x sum(grad log p) = 0`` (GRPO's advantages sum to zero; a constant reward teaches PPO
nothing about which sample to prefer), while its variance is a real group's. A shuffled group moves
the policy by noise of the right size and teaches nothing; everything else the learner sees is
unchanged: the same groups pass DAPO's filter (it reads the multiset), the same groups have zero
advantage, the same reward and accuracy means are logged (``Group.correct`` keeps each sample's
true correctness). A derangement instead would anti-correlate rewards with samples (``E[A_pi(i)] =
-A_i / (G - 1)``: harm by unlearning, not by losing the signal). Permuting rewards *across* groups
would also destroy the signal but change each group's multiset, turning all-correct and
all-wrong groups into noisy ones the true rewards never give, and it needs every group of a batch
before any is trained, which the streaming learner does not wait for.
"""

from __future__ import annotations

import hashlib
import random

_SCALE = float(1 << 64)


def _digest(seed: int, key: str) -> tuple[float, int]:
    """(u in [0, 1), a 64-bit seed for the permutation) of ``key`` under ``seed``."""
    d = hashlib.blake2b(f"{seed}\x00{key}".encode(), digest_size=16).digest()
    return int.from_bytes(d[:8], "big") / _SCALE, int.from_bytes(d[8:], "big")


def is_shuffled(key: str, fraction: float, seed: int) -> bool:
    """Whether group ``key``'s rewards are shuffled (0: never; 1: always)."""
    return fraction > 0.0 and _digest(seed, key)[0] < fraction


def shuffle_rewards(key: str, rewards: list[float], fraction: float, seed: int) -> list[float]:
    """Group ``key``'s rewards as the learner trains on them: permuted within the group when it is
    shuffled (a uniformly random permutation fixed by ``seed`` and ``key``), else as they are."""
    if not is_shuffled(key, fraction, seed):
        return list(rewards)
    out = list(rewards)
    random.Random(_digest(seed, key)[1]).shuffle(out)
    return out


def shuffled_count(keys: list[str], fraction: float, seed: int) -> int:
    """How many of ``keys`` (a consumed batch's groups) were trained on shuffled rewards."""
    return sum(is_shuffled(k, fraction, seed) for k in keys)
