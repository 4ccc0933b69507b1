"""The learner on a tiny model: normalisation contract, PPO step, dynamic sampling."""

from __future__ import annotations

import pytest
import torch

from services.common.config import RunConfig
from services.common.types import SampleRecord
from services.policy.model import build_policy
from services.trainer.learner import Group, Learner

MODEL = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}


def _sample(group: str, i: int, n_tokens: int) -> SampleRecord:
    g = torch.Generator().manual_seed(ord(group) * 10 + i)
    tokens = tuple(int(t) for t in torch.randint(3, 18, (n_tokens,), generator=g))  # the char vocabulary has 19 ids
    return SampleRecord(group, group, i, (1, 5, 6), tokens, tuple(-1.5 for _ in tokens), 0, "stop", 0.0, 0.0, 0.0)


def _groups() -> list[Group]:
    return [
        Group([_sample("a", 0, 3), _sample("a", 1, 7)], [1.0, 0.0]),
        Group([_sample("b", 0, 2), _sample("b", 1, 5)], [0.0, 1.0]),
        Group([_sample("c", 0, 4), _sample("c", 1, 4)], [1.0, 1.0]),
    ]


def _learner(**algo) -> Learner:
    cfg = RunConfig.model_validate({"model": MODEL, "trainer": {"lr": 1e-2, "algorithm": algo}})
    torch.manual_seed(0)
    return Learner(cfg, build_policy(cfg.model))


def _step(learner: Learner, batches: list[list[Group]]) -> dict[str, torch.Tensor]:
    learner.begin()
    for b in batches:
        learner.backward(b)
    learner.step()
    return {k: v.detach().clone() for k, v in learner.model.state_dict().items()}


def _grads(learner: Learner, batches: list[list[Group]]) -> tuple[dict[str, torch.Tensor], float]:
    learner.begin()
    for b in batches:
        learner.backward(b)
    grads = {n: p.grad.clone() for n, p in learner.model.named_parameters() if p.grad is not None}
    return grads, learner._normaliser


@pytest.mark.parametrize(("agg", "normaliser"), [("sample_mean", 6.0), ("token_mean", 25.0)])
def test_micro_batch_split_and_order_do_not_change_the_gradient(agg, normaliser):
    g = _groups()
    one, n_one = _grads(_learner(loss_agg=agg), [g])
    split, n_split = _grads(_learner(loss_agg=agg), [[g[2]], [g[1]], [g[0]]])
    assert n_one == n_split == normaliser  # samples, or completion tokens (3+7+2+5+4+4)
    assert one.keys() == split.keys() and one
    for k in one:
        assert torch.allclose(one[k], split[k], atol=1e-6), k
    learner = _learner(loss_agg=agg)
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    after = _step(learner, [g])
    assert any(not torch.equal(before[k], after[k]) for k in after)  # the step moved the weights


def test_ppo_updates_policy_and_critic():
    learner = _learner(name="ppo")
    critic_before = {k: v.clone() for k, v in learner.critic.state_dict().items()}
    policy_before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    _step(learner, [_groups()])
    assert learner.stats.value_loss > 0
    assert any(not torch.equal(critic_before[k], v) for k, v in learner.critic.state_dict().items())
    assert any(not torch.equal(policy_before[k], v) for k, v in learner.model.state_dict().items())


def test_dynamic_sampling_drops_groups_with_equal_rewards():
    learner = _learner(dynamic_sampling=True)
    _step(learner, [_groups()])
    assert learner.stats.filtered_groups == 1 and learner.stats.trained_samples == 4
