"""The trainer-backend contract (``services.trainer.backends``): every backend passes the same checks.

``torch`` trains the Hugging Face model itself; ``megatron`` a megatron-core GPTModel converted
from it, here on CPU under the test shims (``tests/megatron_shims.py``). Checked: the weight
table is the Hugging Face state dict's (names, order, dtypes, shapes); the weights before
training are the starting weights; GRPO steps on a repeated batch change the weights and lower
the loss; a PPO step trains policy and critic; a KL term runs against a frozen reference; and
the two backends make the same step.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import torch

from services.common.config import RunConfig
from services.common.weights import TensorSpec, specs_of
from services.policy.batch import pack, token_logprobs
from services.policy.model import build_policy
from services.trainer.learner import Learner, StepStats
from tests.unit.test_learner import MODEL, _groups

BACKENDS = ["torch", "megatron"]


@pytest.fixture(params=BACKENDS)
def backend(request) -> Iterator[str]:
    if request.param == "megatron":
        from tests.megatron_shims import cpu_shims, megatron_scope

        with megatron_scope(), cpu_shims():
            yield request.param
    else:
        yield request.param


def _make(backend: str, **trainer) -> tuple[Learner, dict[str, torch.Tensor], dict[str, TensorSpec]]:
    """A learner on ``backend`` over the tiny policy, its starting HF weights and their specs."""
    cfg = RunConfig.model_validate({"model": MODEL, "trainer": {"backend": backend, "lr": 1e-2, **trainer}})
    torch.manual_seed(0)
    policy = build_policy(cfg.model)
    start = {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
    learner = Learner(cfg, policy)
    assert learner.backend.name == backend
    return learner, start, specs_of(start)


def _step(learner: Learner) -> tuple[StepStats, float]:
    stats = learner.begin()
    learner.backward(_groups())
    return stats, learner.step()


def test_the_weight_table_is_the_hf_state_dict(backend):
    learner, _, specs = _make(backend)
    got = learner.backend.hf_specs()
    assert list(got.items()) == list(specs.items())  # names, order, dtypes, shapes
    assert "lm_head.weight" in got  # tied: listed as the HF state dict lists it


def test_weights_before_training_are_the_starting_weights(backend):
    learner, start, _ = _make(backend)
    got = learner.weights().host_copies()
    assert list(got) == list(start)
    for name, value in got.items():
        assert torch.equal(value, start[name]), name


def test_grpo_steps_change_the_weights_and_lower_the_loss(backend):
    learner, start, _ = _make(backend)
    losses = [_step(learner)[0].loss for _ in range(4)]
    assert losses[-1] < losses[0], losses
    after = learner.weights().host_copies()
    assert sum(not torch.equal(after[k], start[k]) for k in start) == len(start)


def test_a_ppo_step_trains_policy_and_critic(backend):
    learner, start, _ = _make(backend, algorithm={"name": "ppo"})
    assert learner.critic is not None
    critic = {k: v.detach().clone() for k, v in learner.critic.named_parameters()}
    stats, _ = _step(learner)
    assert stats.value_loss > 0 and stats.critic_grad_norm > 0
    assert any(not torch.equal(v, critic[k]) for k, v in learner.critic.named_parameters())
    after = learner.weights().host_copies()
    assert any(not torch.equal(after[k], start[k]) for k in start)


def test_a_kl_term_runs_against_a_frozen_reference(backend):
    learner, _, _ = _make(backend, kl_coef=0.1)
    ref = learner.ref
    assert ref is not None and ref is not learner.model
    assert not any(p.requires_grad for p in ref.parameters())
    batch = pack([[1, 5, 6]], [[7, 8, 9]], learner.policy.pad_id)
    with torch.no_grad():
        before = token_logprobs(ref, batch)
    kls = [_step(learner)[0].kl for _ in range(2)]
    assert kls[0] == pytest.approx(0.0, abs=1e-6) and kls[1] > 0  # the policy moved away from the reference
    with torch.no_grad():
        assert torch.equal(token_logprobs(ref, batch), before)


def test_the_backends_make_the_same_step():
    from tests.megatron_shims import cpu_shims, megatron_scope

    torch_learner, _, _ = _make("torch")
    with megatron_scope(), cpu_shims():
        megatron_learner, _, _ = _make("megatron")
        (st_m, norm_m), (st_t, norm_t) = _step(megatron_learner), _step(torch_learner)
        got, want = megatron_learner.weights().host_copies(), torch_learner.weights().host_copies()
    assert st_m.loss == pytest.approx(st_t.loss, rel=1e-5) and norm_m == pytest.approx(norm_t, rel=1e-5)
    for k, p in torch_learner.model.named_parameters():  # the tied lm_head is the embedding
        # AdamW's first update is lr * g / (|g| + 1e-8): an entry whose gradient is round-off
        # (k_proj.bias: exactly 0 in exact arithmetic) may move either way; compare the others
        real = p.grad.abs() > 1e-6
        assert torch.allclose(got[k][real], want[k][real], atol=1e-5), k


# ---------------------------------------------------------------------------------------- LoRA
LORA = {"rank": 4, "alpha": 8.0}


def _make_lora(checkpoint=None, **trainer) -> tuple[Learner, dict[str, torch.Tensor]]:
    """A torch learner training a LoRA adapter over the tiny policy (or ``checkpoint``), and the
    base's starting weights."""
    from services.policy.model import load_policy

    cfg = RunConfig.model_validate({"model": MODEL, "trainer": {"lr": 1e-2, "lora": LORA, **trainer}})
    torch.manual_seed(0)
    policy = load_policy(checkpoint) if checkpoint else build_policy(cfg.model)
    base = {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
    return Learner(cfg, policy), base


def test_the_lora_weight_table_is_the_adapter_the_engines_expect(tiny_checkpoint):
    from services.common.lora import LoraConfig, adapter_specs

    learner, _ = _make_lora(tiny_checkpoint)
    got = learner.backend.hf_specs()
    want = adapter_specs(tiny_checkpoint, LoraConfig(**LORA))
    assert list(got.items()) == list(want.items())  # names, order, dtypes (float32), shapes
    stream = learner.weights()
    tensors = list(stream.checked())
    assert [k for k, _ in tensors] == list(want) and all(".lora_" in k for k in want)
    assert all(torch.equal(v, torch.zeros_like(v)) for k, v in tensors if ".lora_B." in k)  # version 0 = the base


def test_a_lora_step_trains_only_the_adapter():
    learner, base = _make_lora()
    before = learner.weights().host_copies()
    stats, grad_norm = _step(learner)
    assert grad_norm > 0 and stats.trained_samples > 0
    assert {id(p) for p in learner.opt.param_groups[0]["params"]} == {
        id(p) for n, p in learner.model.named_parameters() if ".lora_" in n}
    frozen = learner.model.get_base_model().state_dict()
    for name, value in base.items():  # bit-identical: the base's weights under their LoRA-wrapped names
        key = name if name in frozen else name.replace(".weight", ".base_layer.weight").replace(
            ".bias", ".base_layer.bias")
        assert torch.equal(frozen[key], value), name
    after = learner.weights().host_copies()
    assert list(after) == list(before)
    assert all(not torch.equal(after[k], before[k]) for k in after if ".lora_B." in k)  # every adapter trained


def test_a_lora_kl_reference_is_the_base_without_a_copy():
    learner, _ = _make_lora(kl_coef=0.1)
    ref = learner.ref
    assert ref is not None and not any(p.requires_grad for p in ref.parameters())
    shared = {p.data_ptr() for p in learner.model.parameters()}
    assert {p.data_ptr() for p in ref.parameters()} <= shared  # the policy's own base weights, not a copy
    torch.manual_seed(0)
    base = build_policy(learner.cfg.model).model.eval()
    batch = pack([[1, 5, 6]], [[7, 8, 9]], learner.policy.pad_id)
    with torch.no_grad():
        want = token_logprobs(base, batch)
    kls = [_step(learner)[0].kl for _ in range(2)]
    assert kls[0] == pytest.approx(0.0, abs=1e-6) and kls[1] > 0  # the adapter moved the policy off the base
    with torch.no_grad():
        assert torch.allclose(token_logprobs(ref, batch), want, atol=1e-6)
        assert not torch.allclose(token_logprobs(learner.model, batch), want, atol=1e-4)
    assert learner.model.training  # the reference's eval() is undone after its forward
    assert all(p.requires_grad for n, p in learner.model.named_parameters() if ".lora_" in n)


def test_a_lora_recovery_state_holds_the_adapter_and_resumes_the_same_step():
    learner, _ = _make_lora()
    _step(learner)
    saved = learner.state()
    assert saved["module"] and all(".lora_" in k for k in saved["module"])  # not the frozen base
    saved = {"module": {k: v.clone() for k, v in saved["module"].items()}, "opt": copy.deepcopy(saved["opt"])}
    _step(learner)
    once = learner.weights().host_copies()
    other, _ = _make_lora()  # a restarted learner: fresh adapter, then the checkpoint
    other.load_state(saved)
    _step(other)
    again = other.weights().host_copies()
    assert all(torch.equal(once[k], again[k]) for k in once)


def test_a_lora_ppo_step_trains_the_adapter_and_a_full_critic():
    learner, _ = _make_lora(algorithm={"name": "ppo"})
    assert learner.critic is not None
    assert not any(".lora_" in n for n, _ in learner.critic.named_parameters())  # copied before the wrap
    assert all(p.requires_grad for p in learner.critic.parameters())
    stats, grad_norm = _step(learner)
    assert stats.value_loss > 0 and stats.critic_grad_norm > 0 and grad_norm > 0
