"""The learner and the critic on a tiny model: normalisation contract, PPO step, dynamic sampling."""

from __future__ import annotations

import pytest
import torch

from services.common.config import ModelConfig, RunConfig
from services.common.types import SampleRecord
from services.policy.batch import pack, token_logprobs
from services.policy.model import build_policy
from services.trainer.algorithms import grpo_advantages, policy_loss
from services.trainer.critic import ValueModel
from services.trainer.learner import Group, Learner

MODEL = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}
PROMPT = (1, 5, 6)


def _sample(group: str, i: int, n_tokens: int) -> SampleRecord:
    g = torch.Generator().manual_seed(ord(group) * 10 + i)
    tokens = tuple(int(t) for t in torch.randint(3, 18, (n_tokens,), generator=g))  # the char vocabulary has 19 ids
    # behaviour log-probs -1.5..-3.0: off-policy w.r.t. the trainer's model, so ratios differ from 1
    logprobs = tuple(-1.5 - 0.25 * (k % 7) for k in range(n_tokens))
    return SampleRecord(group, group, i, PROMPT, tokens, logprobs, 0, "stop", 0.0, 0.0, 0.0)


def _groups() -> list[Group]:
    return [
        Group([_sample("a", 0, 3), _sample("a", 1, 7)], [1.0, 0.0]),
        Group([_sample("b", 0, 2), _sample("b", 1, 5), _sample("b", 2, 1)], [0.0, 1.0, 1.0]),
        Group([_sample("c", 0, 4), _sample("c", 1, 4)], [1.0, 1.0]),  # all equal: zero advantages
    ]


def _learner(max_grad_norm: float = 1.0, **algo) -> Learner:
    cfg = RunConfig.model_validate(
        {"model": MODEL, "trainer": {"lr": 1e-2, "max_grad_norm": max_grad_norm, "algorithm": algo}}
    )
    torch.manual_seed(0)
    return Learner(cfg, build_policy(cfg.model))


def _modules(learner: Learner) -> dict[str, torch.nn.Module]:
    return {"policy": learner.model, **({"critic": learner.critic} if learner.critic is not None else {})}


def _state(learner: Learner) -> dict[str, torch.Tensor]:
    return {f"{m}.{k}": v.detach().clone() for m, mod in _modules(learner).items() for k, v in mod.named_parameters()}


def _step(learner: Learner, batches: list[list[Group]]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """-> (parameters after the step, the normalised and clipped gradients the step applied)."""
    learner.begin()
    for b in batches:
        learner.backward(b)
    learner.step()
    grads = {f"{m}.{k}": p.grad.clone() for m, mod in _modules(learner).items() for k, p in mod.named_parameters()}
    return _state(learner), grads


@pytest.mark.parametrize("name", ["grpo", "ppo"])
@pytest.mark.parametrize("agg", ["sample_mean", "token_mean"])
def test_step_does_not_depend_on_micro_batch_split_or_order(name, agg):
    g = _groups()
    initial = _state(_learner(name=name, loss_agg=agg))
    one, g_one = _step(_learner(name=name, loss_agg=agg), [g])
    for batches in ([[g[0]], [g[1], g[2]]], [[g[1], g[2]], [g[0]]]):
        params, grads = _step(_learner(name=name, loss_agg=agg), batches)
        assert params.keys() == one.keys()
        for k in one:
            assert torch.allclose(grads[k], g_one[k], atol=1e-8, rtol=1e-5), k
            # AdamW's first update is lr * g / (|g| + 1e-8): an entry whose gradient is round-off
            # (e.g. k_proj.bias, exactly 0 in exact arithmetic) moves by +-lr either way
            real = g_one[k].abs() > 1e-6
            assert torch.allclose(params[k][real], one[k][real], atol=1e-6), k
    moved = {k.split(".")[0] for k in one if not torch.equal(one[k], initial[k])}
    assert moved == ({"policy", "critic"} if name == "ppo" else {"policy"})


@pytest.mark.parametrize(("agg", "normaliser"), [("sample_mean", 7.0), ("token_mean", 26.0)])
def test_normalised_gradient_is_the_gradient_of_the_batch_mean_loss(agg, normaliser):
    """The learner's gradient after ``step``'s normalisation equals the gradient of the loss
    averaged over the whole batch (samples: 2 + 3 + 2; tokens: 3+7 + 2+5+1 + 4+4)."""
    g = _groups()
    learner = _learner(max_grad_norm=1e6, loss_agg=agg)  # no clipping: compare raw gradients
    learner.begin()
    learner.backward([g[2], g[0]])
    learner.backward([g[1]])
    assert learner._normaliser == normaliser and learner.stats.zero_adv_groups == 1
    learner.step()

    ref = _learner(loss_agg=agg).model
    samples = [s for group in g for s in group.samples]
    adv = torch.cat([grpo_advantages(torch.tensor(group.rewards)) for group in g])
    batch = pack([list(PROMPT)] * len(samples), [list(s.token_ids) for s in samples], 0)
    behav = torch.zeros_like(batch.completion_mask)
    for b, s in enumerate(samples):
        behav[b, len(PROMPT) - 1 : len(PROMPT) - 1 + len(s.logprobs)] = torch.tensor(s.logprobs)
    loss, _ = policy_loss(token_logprobs(ref, batch), behav, adv, batch.completion_mask, clip_low=0.2, loss_agg=agg)
    (loss / normaliser).backward()
    for (name, p), q in zip(learner.model.named_parameters(), ref.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, name
        assert torch.allclose(p.grad, q.grad, atol=1e-7, rtol=1e-4), name


def test_ppo_step_updates_policy_and_critic_and_reports_value_loss():
    learner = _learner(name="ppo")
    assert learner.critic is not None
    _step(learner, [_groups()])
    st = learner.stats
    assert st.trained_samples == 7 and st.zero_adv_groups == 0  # ppo never skips a group
    assert st.value_loss > 0 and st.critic_grad_norm > 0


def test_dynamic_sampling_drops_groups_with_equal_rewards():
    learner = _learner(dynamic_sampling=True)
    _step(learner, [_groups()])
    assert learner.stats.filtered_groups == 1 and learner.stats.trained_samples == 5
    assert learner._normaliser == 5.0 and learner.stats.zero_adv_groups == 0
    plain = _learner()
    _step(plain, [_groups()])
    assert plain.stats.filtered_groups == 0 and plain._normaliser == 7.0 and plain.stats.zero_adv_groups == 1


def _learner_skip(skip: bool, kl_coef: float = 0.0, **algo) -> Learner:
    cfg = RunConfig.model_validate({"model": MODEL, "trainer": {
        "lr": 1e-2, "max_grad_norm": 1.0, "kl_coef": kl_coef, "skip_zero_advantage_groups": skip, "algorithm": algo}})
    torch.manual_seed(0)
    return Learner(cfg, build_policy(cfg.model))


@pytest.mark.parametrize("agg", ["sample_mean", "token_mean"])
def test_training_zero_advantage_groups_changes_the_compute_not_the_step(agg):
    """``trainer.skip_zero_advantage_groups=false``: the all-equal group (c) goes through
    forward/backward (trained, not counted as skipped), and the step is the one the skipping
    learner takes: a zero advantage adds exactly nothing to the gradient, and the normaliser
    counted the group's samples (or tokens) either way."""
    g = _groups()
    skip, no_skip = _learner_skip(True, loss_agg=agg), _learner_skip(False, loss_agg=agg)
    initial = _state(no_skip)
    params_skip, grads_skip = _step(skip, [g])
    params_all, grads_all = _step(no_skip, [g])
    assert (skip.stats.zero_adv_groups, skip.stats.trained_samples) == (1, 5)
    assert (no_skip.stats.zero_adv_groups, no_skip.stats.trained_samples) == (0, 7)
    assert skip._normaliser == no_skip._normaliser
    assert not all(torch.equal(params_all[k], initial[k]) for k in initial)  # the step ran
    for k in grads_skip:
        assert torch.allclose(grads_all[k], grads_skip[k], atol=1e-8, rtol=1e-5), k
        real = grads_skip[k].abs() > 1e-6  # round-off entries move by +-lr under AdamW's first step
        assert torch.allclose(params_all[k][real], params_skip[k][real], atol=1e-6), k
    # the loss statistic is a sum over micro-batches: the zero-advantage group adds 0 to it
    assert no_skip.stats.loss == pytest.approx(skip.stats.loss, abs=1e-7)


def test_only_zero_advantage_groups_still_take_a_zero_gradient_step():
    """A batch of only zero-advantage groups: skipped, nothing is computed; trained, the
    forward/backward runs and every gradient is exactly zero."""
    only = [_groups()[2]]
    skip, no_skip = _learner_skip(True), _learner_skip(False)
    initial = _state(skip)
    skip.begin()
    skip.backward(only)
    skip.step()
    assert skip.stats.micro_batches == 0 and skip.stats.zero_adv_groups == 1
    assert all(p.grad is None for p in skip.model.parameters())  # nothing was computed
    params, grads = _step(no_skip, [only])
    assert no_skip.stats.micro_batches == 1 and no_skip.stats.trained_samples == 2
    assert all(float(v.abs().max()) == 0.0 for v in grads.values())
    for k in initial:  # a zero gradient moves nothing (AdamW, no weight decay), as skipping does
        assert torch.equal(params[k], initial[k]) and torch.equal(_state(skip)[k], initial[k]), k


def test_kl_term_never_skips_whatever_the_flag():
    for flag in (True, False):
        learner = _learner_skip(flag, kl_coef=0.01)
        _step(learner, [_groups()])
        assert learner.stats.zero_adv_groups == 0 and learner.stats.trained_samples == 7


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_critic_values_are_aligned_with_the_completion_grid(arch):
    policy = build_policy(ModelConfig(arch=arch, **MODEL))
    critic = ValueModel(policy.model)
    batch = pack([[1, 5, 6], [1, 7]], [[8, 9], [10, 11, 12]], 0)
    values = critic.values(batch)
    assert values.shape == batch.completion_mask.shape == (2, 4)
    assert not values.any()  # zero-initialised head
    torch.nn.init.normal_(critic.head.weight)
    values = critic.values(batch)
    changed = pack([[1, 5, 6], [1, 7]], [[8, 9], [10, 11, 13]], 0)  # last token of row 1 (position 4)
    after = critic.values(changed)
    # V[b, t] sees tokens 0..t only: position 4 is never an input to the grid, so nothing changes
    assert torch.allclose(values, after, atol=1e-6)
    earlier = pack([[1, 5, 6], [1, 7]], [[8, 9], [10, 14, 12]], 0)  # position 3 of row 1
    moved = critic.values(earlier)
    assert torch.allclose(values[0], moved[0], atol=1e-6) and torch.allclose(values[1, :3], moved[1, :3], atol=1e-6)
    assert not torch.allclose(values[1, 3], moved[1, 3], atol=1e-4)
    # the backbone is a copy: training the critic leaves the policy alone
    critic_embed = critic.backbone.embed_tokens.weight
    assert critic_embed.data_ptr() != policy.model.model.embed_tokens.weight.data_ptr()


def test_trainer_log_probs_use_the_sampling_temperature():
    torch.manual_seed(0)
    model = torch.nn.Module()
    logits = torch.randn(1, 4, 7)

    class Out:
        def __init__(self, x):
            self.logits = x

    model.forward = lambda input_ids, attention_mask: Out(logits)  # type: ignore[method-assign]
    batch = pack([[1]], [[2, 3, 4]], 0)
    for t in (1.0, 0.6):
        expected = (torch.log_softmax(logits[:, :-1] / t, -1)
                    .gather(-1, batch.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1))
        assert torch.allclose(token_logprobs(model, batch, t), expected)
