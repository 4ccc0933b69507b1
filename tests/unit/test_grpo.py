import math

import pytest
import torch

from services.trainer.grpo import advantage_estimator, dr_grpo_advantages, grpo_advantages, policy_loss


def test_group_advantages_hand_computed():
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    assert torch.allclose(adv, torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-5)
    assert torch.equal(grpo_advantages(torch.tensor([1.0, 1.0, 1.0])), torch.zeros(3))
    assert torch.allclose(dr_grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0])), torch.tensor([0.75, -0.25, -0.25, -0.25]))
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        advantage_estimator("nope")


def test_clipped_loss_hand_computed():
    # sample 0: two tokens, ratios 1.5 and 1.0, A=+1, eps=0.2 -> surrogates 1.2 and 1.0 -> L0 = -1.1
    # sample 1: one token (second is padding), ratio 0.5, A=-1 -> min(-0.5, -0.8) = -0.8 -> L1 = 0.8
    logp_old = torch.log(torch.tensor([[0.4, 0.5], [0.6, 0.3]]))
    logp = torch.log(torch.tensor([[0.6, 0.5], [0.3, 0.9]]))
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, stats = policy_loss(logp, logp_old, torch.tensor([1.0, -1.0]), mask, clip_eps=0.2)
    assert loss.item() == pytest.approx(-1.1 + 0.8, abs=1e-5)
    assert stats.clip_fraction == pytest.approx(2 / 3)


def test_kl_term_is_k3_estimator():
    logp = torch.log(torch.tensor([[0.5]]))
    ref = torch.log(torch.tensor([[0.25]]))
    loss, stats = policy_loss(logp, logp, torch.zeros(1), torch.ones(1, 1), clip_eps=0.2, logp_ref=ref, kl_coef=0.1)
    q = math.log(0.25) - math.log(0.5)
    k3 = math.exp(q) - q - 1
    assert stats.kl == pytest.approx(k3, rel=1e-5)
    assert loss.item() == pytest.approx(0.1 * k3, rel=1e-5)


def test_loss_gradient_raises_probability_of_advantaged_tokens():
    logits = torch.zeros(1, 3, requires_grad=True)
    logp = torch.log_softmax(logits, -1)[:, :1]  # log-prob of token 0
    loss, _ = policy_loss(logp, logp.detach(), torch.tensor([1.0]), torch.ones(1, 1), clip_eps=0.2)
    loss.backward()
    assert logits.grad[0, 0] < 0  # gradient descent increases token 0's logit
