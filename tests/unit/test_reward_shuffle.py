"""``reward.shuffle_fraction``: a share of the groups trained on rewards permuted within the group
(``services.rollout.reward_shuffle``), applied where a group becomes what the learner trains on
(``GroupLifecycle.complete``) and counted in every metrics row (``reward_shuffled_groups``)."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import pytest
import torch

from services.common.config import ConfigError, load_config
from services.common.types import SampleRecord
from services.rollout.handoff import StepOrder
from services.rollout.lifecycle import GroupLifecycle
from services.rollout.reward_shuffle import is_shuffled, shuffle_rewards, shuffled_count
from services.rollout.rewards import Outcome
from services.trainer.algorithms import grpo_advantages
from tests.conftest import ROOT

KEYS = [f"p{i}" for i in range(10_000)]
REWARDS = [0.0, 1.0, 0.0, 0.5, 1.0, 0.0, 0.25, 1.0]  # distinct positions, ties included


def test_the_shuffle_is_deterministic_by_seed_and_key():
    a = [shuffle_rewards(k, REWARDS, 0.5, seed=3) for k in KEYS[:200]]
    assert a == [shuffle_rewards(k, REWARDS, 0.5, seed=3) for k in KEYS[:200]]
    chosen = {k for k in KEYS if is_shuffled(k, 0.5, seed=3)}
    assert chosen != {k for k in KEYS if is_shuffled(k, 0.5, seed=4)}  # another seed, other groups


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9])
def test_about_the_declared_share_of_groups_is_shuffled(fraction):
    """The choice is a hash per group: the share is exact in expectation and binomial over n groups
    (within 4 standard deviations here); a larger fraction shuffles a superset of the groups."""
    n = shuffled_count(KEYS, fraction, seed=0)
    assert abs(n / len(KEYS) - fraction) <= 4 * math.sqrt(fraction * (1 - fraction) / len(KEYS))
    smaller = {k for k in KEYS if is_shuffled(k, fraction / 2, seed=0)}
    assert smaller <= {k for k in KEYS if is_shuffled(k, fraction, seed=0)}


def test_a_shuffled_group_keeps_its_rewards_and_advantages_but_not_their_samples():
    shuffled = [k for k in KEYS[:2000] if is_shuffled(k, 0.5, seed=0)]
    moved = 0
    for k in shuffled:
        out = shuffle_rewards(k, REWARDS, 0.5, seed=0)
        assert sorted(out) == sorted(REWARDS)  # the group's multiset of rewards
        adv, true_adv = grpo_advantages(torch.tensor(out)), grpo_advantages(torch.tensor(REWARDS))
        assert torch.allclose(adv.sort().values, true_adv.sort().values)  # the same advantages, elsewhere
        moved += out != REWARDS
    assert moved >= 0.9 * len(shuffled)


def test_the_permutation_is_uniform_not_a_derangement():
    """Each sample keeps its own reward with probability 1/G: no information either way (a derangement
    would make a sample's reward anti-correlated with its own)."""
    g = 8
    shuffled = [k for k in KEYS if is_shuffled(k, 0.5, seed=0)]
    kept = sum(r == i for k in shuffled for i, r in enumerate(shuffle_rewards(k, list(range(g)), 0.5, seed=0)))
    n = len(shuffled) * g
    assert abs(kept / n - 1 / g) <= 4 * math.sqrt((1 / g) * (1 - 1 / g) / n)


def test_fraction_zero_is_a_no_op_and_one_shuffles_every_group():
    assert shuffled_count(KEYS, 0.0, seed=0) == 0
    assert all(shuffle_rewards(k, REWARDS, 0.0, seed=0) == REWARDS for k in KEYS[:500])
    assert shuffled_count(KEYS, 1.0, seed=0) == len(KEYS)


@pytest.mark.parametrize(("value", "message"), [
    ("1.5", "reward.shuffle_fraction: Input should be less than or equal to 1 (got 1.5)"),
    ("-0.1", "reward.shuffle_fraction: Input should be greater than or equal to 0 (got -0.1)"),
    ("nan", "reward.shuffle_fraction: Input should be less than or equal to 1"),
])
def test_a_bad_fraction_is_refused_naming_the_field_and_the_value(value, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(ROOT / "deploy/configs/smoke.yaml", [f"reward.shuffle_fraction={value}"])


# ---------------------------------------------------------------------------- the seam: GroupLifecycle
def _sample(key: str, i: int) -> SampleRecord:
    return SampleRecord(key, key, i, (1,), (2, 3), (-0.1, -0.2), 0, "stop", 0.0, 0.0, 0.0)


def _one_step(fraction: float) -> tuple[StepOrder, dict[str, list[float]]]:
    """One sync step through the group lifecycle (no processes): every group complete, the head
    buffer consumed; (the step order the learner gets, each group's true rewards)."""
    cfg = load_config(ROOT / "deploy/configs/smoke.yaml",
                      ["trainer.mode=sync", "trainer.prompts_per_iteration=16", "trainer.group_size=8",
                       f"reward.shuffle_fraction={fraction}", "reward.shuffle_seed=7"])
    rt = SimpleNamespace(cfg=cfg, version=0, recovery_due=lambda v: False, sampler=SimpleNamespace(state=dict))
    life = GroupLifecycle(rt)
    life.start_head()
    true: dict[str, list[float]] = {}
    for j in range(16):
        key = f"p{j}"
        true[key] = REWARDS[j % 8:] + REWARDS[: j % 8]
        life.mgr.reserve(key, 0)
        assert life.complete(key, [_sample(key, i) for i in range(8)], [Outcome(r, r == 1.0) for r in true[key]])
    assert life.mgr.ready()
    life._hand_over(0)
    while not isinstance(order := life.handoff.take(), StepOrder):
        pass
    return order, true


def test_the_lifecycle_trains_shuffled_groups_on_permuted_rewards_and_counts_them():
    order, true = _one_step(0.5)
    keys = [g.samples[0].prompt_id for g in order.groups]
    expected = [k for k in keys if is_shuffled(k, 0.5, seed=7)]
    assert 0 < len(expected) < len(keys)  # some of each (16 groups, seed 7)
    assert order.extra["reward_shuffled_groups"] == len(expected)
    for key, g in zip(keys, order.groups, strict=True):
        assert sorted(g.rewards) == sorted(true[key])
        assert g.rewards == shuffle_rewards(key, true[key], 0.5, seed=7)
        assert g.correct == [r == 1.0 for r in true[key]]  # accuracy stays each sample's own
    assert any(g.rewards != true[k] for k, g in zip(keys, order.groups, strict=True))


def test_the_lifecycle_leaves_rewards_alone_at_fraction_zero():
    order, true = _one_step(0.0)
    assert order.extra["reward_shuffled_groups"] == 0
    assert all(g.rewards == true[g.samples[0].prompt_id] for g in order.groups)
