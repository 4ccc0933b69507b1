import math

import pytest
import torch

from services.trainer.algorithms import (
    MicroBatch,
    ObjectiveParams,
    advantage_estimator,
    dapo_keep_group,
    dr_grpo_advantages,
    gae,
    get_algorithm,
    grpo_advantages,
    outcome_rewards,
    policy_loss,
    register_advantage,
    register_algorithm,
    value_loss,
)


def test_group_advantages_hand_computed():
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    assert torch.allclose(adv, torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-5)
    assert torch.equal(grpo_advantages(torch.tensor([1.0, 1.0, 1.0])), torch.zeros(3))
    dr = dr_grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]))
    assert torch.allclose(dr, torch.tensor([0.75, -0.25, -0.25, -0.25]))
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        advantage_estimator("nope")


def test_clipped_loss_hand_computed():
    # sample 0: two tokens, ratios 1.5 and 1.0, A=+1, eps=0.2 -> surrogates 1.2 and 1.0 -> L0 = -1.1
    # sample 1: one token (second is padding), ratio 0.5, A=-1 -> min(-0.5, -0.8) = -0.8 -> L1 = 0.8
    logp_old = torch.log(torch.tensor([[0.4, 0.5], [0.6, 0.3]]))
    logp = torch.log(torch.tensor([[0.6, 0.5], [0.3, 0.9]]))
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, stats = policy_loss(logp, logp_old, torch.tensor([1.0, -1.0]), mask, clip_low=0.2)
    assert loss.item() == pytest.approx(-1.1 + 0.8, abs=1e-5)
    assert stats.clip_fraction == pytest.approx(2 / 3)


def test_kl_term_is_k3_estimator():
    logp = torch.log(torch.tensor([[0.5]]))
    ref = torch.log(torch.tensor([[0.25]]))
    loss, stats = policy_loss(logp, logp, torch.zeros(1), torch.ones(1, 1), clip_low=0.2, logp_ref=ref, kl_coef=0.1)
    q = math.log(0.25) - math.log(0.5)
    k3 = math.exp(q) - q - 1
    assert stats.kl == pytest.approx(k3, rel=1e-5)
    assert loss.item() == pytest.approx(0.1 * k3, rel=1e-5)


def test_loss_gradient_raises_probability_of_advantaged_tokens():
    logits = torch.zeros(1, 3, requires_grad=True)
    logp = torch.log_softmax(logits, -1)[:, :1]  # log-prob of token 0
    loss, _ = policy_loss(logp, logp.detach(), torch.tensor([1.0]), torch.ones(1, 1), clip_low=0.2)
    loss.backward()
    assert logits.grad[0, 0] < 0  # gradient descent increases token 0's logit


def test_clip_higher_keeps_gradient_between_the_two_bounds():
    # ratio 1.25, A = +1: symmetric eps 0.2 clips it (no gradient); clip_high 0.28 does not
    logp_old = torch.log(torch.tensor([[0.4]]))
    logits = torch.log(torch.tensor([[0.5, 0.5]])).requires_grad_(True)
    for high, clipped in ((None, True), (0.28, False)):
        logp = torch.log_softmax(logits, -1)[:, :1]
        loss, stats = policy_loss(logp, logp_old, torch.tensor([1.0]), torch.ones(1, 1), clip_low=0.2, clip_high=high)
        assert loss.item() == pytest.approx(-1.2 if clipped else -1.25, abs=1e-5)
        logits.grad = None
        loss.backward()
        assert (logits.grad.abs().sum().item() == 0) == clipped
        assert stats.clip_fraction == (1.0 if clipped else 0.0)


def test_token_mean_weighs_long_samples_more_than_sample_mean():
    # on-policy (ratio 1): per-token loss = -A. Sample 0: 3 tokens, A=+1; sample 1: 1 token, A=-1.
    logp = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    sample, _ = policy_loss(logp, logp, adv, mask, clip_low=0.2, loss_agg="sample_mean")
    token, _ = policy_loss(logp, logp, adv, mask, clip_low=0.2, loss_agg="token_mean")
    assert sample.item() == pytest.approx(-1.0 + 1.0)  # mean over each sample's tokens, summed
    assert token.item() == pytest.approx(-3.0 + 1.0)  # sum over all 4 tokens


def test_off_policy_weights_truncate_or_mask_stale_tokens():
    # pi_theta (= pi_old = pi_prox) probs 0.6 and 0.5; behaviour probs 0.2 and 0.4 -> w = 3.0 and 1.25
    logp = torch.log(torch.tensor([[0.6, 0.5]])).requires_grad_(True)
    behav = torch.log(torch.tensor([[0.2, 0.4]]))
    mask = torch.ones(1, 2)
    adv = torch.tensor([1.0])
    kw = {"clip_low": 0.2, "loss_agg": "token_mean", "is_cap": 2.0}
    tis, s_tis = policy_loss(logp, behav, adv, mask, off_policy="tis", **kw)
    dec, s_dec = policy_loss(logp, behav, adv, mask, off_policy="decoupled", **kw)
    none, s_none = policy_loss(logp, behav, adv, mask, **kw)
    assert tis.item() == pytest.approx(-(2.0 + 1.25))  # rho = 1; w truncated to 2
    assert dec.item() == pytest.approx(-(0.0 + 1.25))  # w = 3 > cap: token masked
    assert s_tis.is_capped_fraction == s_dec.is_capped_fraction == 0.5
    assert s_tis.is_weight_mean == pytest.approx((2.0 + 1.25) / 2)
    # 'none': ratios 3.0 and 1.25 vs behaviour, both above 1 + 0.2 -> clipped to 1.2 each
    assert none.item() == pytest.approx(-2.4) and s_none.clip_fraction == 1.0


def test_gae_hand_computed():
    # one sample, 3 completion tokens after one prompt position; reward 1 at the end
    # values v = [., 0.5, 0.4, 0.2]; gamma 0.9, lam 0.8
    # t=3: delta = 1 - 0.2 = 0.8;                   A3 = 0.8
    # t=2: delta = 0.9*0.2 - 0.4 = -0.22;            A2 = -0.22 + 0.72*0.8 = 0.356
    # t=1: delta = 0.9*0.4 - 0.5 = -0.14;            A1 = -0.14 + 0.72*0.356 = 0.11632
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    values = torch.tensor([[9.0, 0.5, 0.4, 0.2]])
    rewards = outcome_rewards(torch.tensor([1.0]), mask)
    assert rewards.tolist() == [[0.0, 0.0, 0.0, 1.0]]
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    assert adv[0].tolist() == pytest.approx([0.0, 0.11632, 0.356, 0.8], abs=1e-5)
    assert ret[0].tolist() == pytest.approx([0.0, 0.61632, 0.756, 1.0], abs=1e-5)


def test_value_loss_is_clipped_around_rollout_values():
    # v = 1.0, old = 0.0, R = 1.0, clip 0.2: unclipped err 0, clipped v 0.2 -> err 0.64; max -> 0.32
    loss = value_loss(torch.tensor([[1.0]]), torch.tensor([[0.0]]), torch.tensor([[1.0]]), torch.ones(1, 1), clip=0.2)
    assert loss.item() == pytest.approx(0.32)


def test_unclipped_negative_advantage_keeps_large_stale_ratio():
    # 'none', A = -1: ratio 3.0 (> 1 + eps) -> min(-3.0, -1.2) = -3.0: the unbounded weight passes (loss 3.0);
    # ratio 0.5 (< 1 - eps) -> min(-0.5, -0.8) = -0.8: clipped, no gradient
    behav = torch.log(torch.tensor([[0.2, 0.8]]))
    logp = torch.log(torch.tensor([[0.6, 0.4]])).requires_grad_(True)
    loss, _ = policy_loss(logp, behav, torch.tensor([-1.0]), torch.ones(1, 2), clip_low=0.2, loss_agg="token_mean")
    assert loss.item() == pytest.approx(3.0 + 0.8)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([3.0, 0.0])  # d(-rho A)/dlogp = rho for A = -1


def test_gae_on_a_padded_batch_matches_hand_computation():
    # row 0: prompt position, 2 completion tokens, 1 pad; row 1: 3 completion tokens from position 1
    # gamma 1, lam 0.5, reward 1 on each row's last completion token
    # row 0, values [., 0.5, 0.2, 7]: A2 = 1 - 0.2 = 0.8 (pad value 7 ignored: terminal)
    #                                   A1 = (0.2 - 0.5) + 0.5 * 0.8 = 0.1
    # row 1, values [., 0, 0, 0]: deltas [0, 0, 1] -> A = [0.25, 0.5, 1]
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 1.0, 1.0]])
    values = torch.tensor([[3.0, 0.5, 0.2, 7.0], [3.0, 0.0, 0.0, 0.0]])
    rewards = outcome_rewards(torch.tensor([1.0, 1.0]), mask)
    assert rewards.tolist() == [[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]]
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=0.5)
    assert adv.flatten().tolist() == pytest.approx([0.0, 0.1, 0.8, 0.0,  # row 0
                                                    0.0, 0.25, 0.5, 1.0])  # row 1
    assert ret.flatten().tolist() == pytest.approx([0.0, 0.6, 1.0, 0.0,  # row 0
                                                    0.0, 0.25, 0.5, 1.0])  # row 1


def test_outcome_reward_of_an_empty_completion_is_dropped():
    assert outcome_rewards(torch.tensor([2.0]), torch.zeros(1, 3)).tolist() == [[0.0, 0.0, 0.0]]


def test_ppo_objective_hand_computed():
    # one sample, 2 completion tokens, on-policy, values [0.5, 0.2], reward 1, gamma = lam = 1
    # A = [(0.2 - 0.5) + 0.8, 1 - 0.2] = [0.5, 0.8], returns [1, 1]
    # policy (sample_mean): -(0.5 + 0.8) / 2 = -0.65; value: 0.5 * ((0.5 - 1)^2 + (0.2 - 1)^2) / 2 = 0.2225
    # total with vf_coef 0.5: -0.65 + 0.11125 = -0.53875
    ppo = get_algorithm("ppo")
    assert ppo.uses_critic and not ppo.signal_is_advantage
    values = torch.tensor([[0.5, 0.2]], requires_grad=True)
    logp = torch.log(torch.tensor([[0.5, 0.25]])).requires_grad_(True)
    mb = MicroBatch(logp, logp.detach(), torch.ones(1, 2), ppo.group_signal(torch.tensor([1.0]), ObjectiveParams()),
                    values=values)
    out = ppo.loss(mb, ObjectiveParams(gamma=1.0, lam=1.0, vf_coef=0.5))
    assert out.policy_loss == pytest.approx(-0.65) and out.value_loss == pytest.approx(0.2225)
    assert out.loss.item() == pytest.approx(-0.53875)
    out.loss.backward()
    # d/dv of 0.5 * 0.5 * mean((v - 1)^2) = 0.5 * (v - 1) / 2 -> [-0.125, -0.2]
    assert values.grad[0].tolist() == pytest.approx([-0.125, -0.2])
    with pytest.raises(ValueError, match="critic"):
        ppo.loss(MicroBatch(logp, logp.detach(), torch.ones(1, 2), torch.ones(1)), ObjectiveParams())


def test_grpo_objective_uses_the_configured_estimator_and_clip():
    grpo = get_algorithm("grpo")
    assert not grpo.uses_critic and grpo.signal_is_advantage
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert grpo.group_signal(rewards, ObjectiveParams(advantage="dr_grpo")).tolist() == pytest.approx(
        [0.75, -0.25, -0.25, -0.25]
    )
    # ratio 1.25 vs behaviour, A = +1, clip_high 0.28 -> not clipped: loss -1.25
    mb = MicroBatch(torch.log(torch.tensor([[0.5]])), torch.log(torch.tensor([[0.4]])), torch.ones(1, 1), torch.ones(1))
    assert grpo.loss(mb, ObjectiveParams(clip_high=0.28)).policy_loss == pytest.approx(-1.25)
    assert grpo.loss(mb, ObjectiveParams()).policy_loss == pytest.approx(-1.2)


def test_dynamic_sampling_filter():
    assert not dapo_keep_group([1.0, 1.0, 1.0]) and not dapo_keep_group([0.5])
    assert dapo_keep_group([0.0, 1.0]) and dapo_keep_group([1.0, 1.0, 0.9])


def test_registries_reject_unknown_and_duplicate_names():
    assert get_algorithm("ppo").name == "ppo"
    with pytest.raises(ValueError, match=r"unknown algorithm 'a2c'; registered: \['grpo', 'ppo'\]"):
        get_algorithm("a2c")
    with pytest.raises(ValueError, match="already registered"):
        register_algorithm("grpo", uses_critic=False, signal_is_advantage=True, group_signal=lambda r, p: r)
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("grpo")
    with pytest.raises(ValueError, match="unknown off-policy correction"):
        policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1), clip_low=0.2,
                    off_policy="vtrace")
