"""trainer.device / dtype / activation_checkpointing on a tiny model (CPU; CUDA in tests/gpu)."""

from __future__ import annotations

import pydantic
import pytest
import torch

from services.common.config import RunConfig, TrainerConfig, WeightsConfig
from services.policy.model import build_policy
from services.run.transport import DirectTransport
from services.trainer.device import DeviceError, ServedWeights, resolve_device
from services.trainer.learner import Learner
from tests.unit.test_learner import MODEL, _groups, _state, _step


def _learner(parallel=None, weights_dtype="float32", **trainer) -> Learner:
    cfg = RunConfig.model_validate({"model": MODEL, "trainer": {"lr": 1e-2, **trainer},
                                    "generation": {"engine": "vllm"}, "weights": {"dtype": weights_dtype}})
    torch.manual_seed(0)
    return Learner(cfg, build_policy(cfg.model), parallel)


def test_device_settings_are_validated_by_the_schema():
    for ok in ("cpu", "cuda", "cuda:1"):
        assert TrainerConfig(device=ok).device == ok
    for bad in ("gpu", "cuda:", "cuda:x", "CPU", "mps"):
        with pytest.raises(pydantic.ValidationError, match="device"):
            TrainerConfig(device=bad)
    with pytest.raises(pydantic.ValidationError, match="dtype"):
        TrainerConfig(dtype="float16")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
@pytest.mark.parametrize("spec", ["cuda", "cuda:0", "cuda:3"])
def test_an_absent_cuda_device_is_a_clear_error(spec):
    with pytest.raises(DeviceError, match=f"trainer.device is '{spec}' but this machine has no usable CUDA device"):
        resolve_device(spec)
    with pytest.raises(DeviceError, match="no usable CUDA device"):
        _learner(device=spec)


def test_bfloat16_computes_in_bfloat16_but_keeps_float32_master_weights():
    g = _groups()
    _, grads32 = _step(_learner(), [g])
    params16, grads16 = _step(_learner(dtype="bfloat16"), [g])
    for k in grads32:
        assert params16[k].dtype == torch.float32 and grads16[k].dtype == torch.float32, k
    flat32 = torch.cat([v.flatten() for v in grads32.values()])
    flat16 = torch.cat([v.flatten() for v in grads16.values()])
    # the same gradient up to bfloat16 rounding (8 mantissa bits), but not bit-identical: autocast ran
    assert torch.nn.functional.cosine_similarity(flat32, flat16, dim=0) > 0.99
    assert not torch.equal(flat32, flat16)


def test_activation_checkpointing_gives_the_same_gradients():
    g = _groups()
    learner = _learner(activation_checkpointing=True)
    assert learner.model.is_gradient_checkpointing
    _, plain = _step(_learner(), [g])
    _, recomputed = _step(learner, [g])
    for k in plain:
        assert torch.allclose(recomputed[k], plain[k], atol=1e-7, rtol=1e-5), k


def test_the_direct_transport_snapshots_to_host_memory():
    learner = _learner()
    snap = DirectTransport(WeightsConfig()).snapshot(learner.weights())
    state = learner.model.state_dict()
    assert snap.keys() == state.keys()
    for k, v in snap.items():
        assert v.device.type == "cpu" and v.dtype == torch.float32
        assert v.data_ptr() != state[k].data_ptr()  # a copy, not a view of the live weights


def test_the_micro_batch_token_budget_sets_the_passes_not_the_update():
    """trainer.micro_batch_tokens: several passes at a tiny budget, one pass for all at a large
    one; the gradients are the same (up to float32 summation order)."""
    from tests.unit.test_learner import _groups, _step

    small, large = _learner(micro_batch_tokens=16), _learner(micro_batch_tokens=1_000_000)
    _, g_small = _step(small, [_groups()])
    _, g_large = _step(large, [_groups()])
    assert small.stats.trained_samples == large.stats.trained_samples == 5  # group c has zero advantages
    assert small.stats.micro_batches >= 3 and large.stats.micro_batches == 1
    for k in g_small:
        assert torch.allclose(g_small[k], g_large[k], atol=1e-6, rtol=1e-4), k


def test_served_weights_round_in_place_and_give_the_masters_back_bit_for_bit():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(64, 8)), torch.nn.Parameter(torch.randn(5))]
    masters = [p.detach().clone() for p in params]
    served = ServedWeights(params, "bfloat16")
    served.enter()
    served.enter()  # already rounded: the masters stay the first ones
    assert served.rounded
    for p, m in zip(params, masters, strict=True):
        assert p.dtype == torch.float32 and torch.equal(p, m.to(torch.bfloat16).float()) and not torch.equal(p, m)
    served.leave()
    assert not served.rounded and all(torch.equal(p, m) for p, m in zip(params, masters, strict=True))
    plain = ServedWeights(params, "float32")  # float32 versions: nothing held, nothing changed
    plain.enter()
    assert not plain.rounded and all(torch.equal(p, m) for p, m in zip(params, masters, strict=True))


def test_bfloat16_versions_take_the_gradient_at_the_served_rounding_and_step_the_float32_masters():
    """The learner scores the policy the SGS samples from (the masters rounded to weights.dtype):
    its gradient is a float32 learner's at the rounded weights; the step lands on the masters."""
    g = _groups()
    served = _learner(weights_dtype="bfloat16")
    at_rounding = _learner()
    masters = _state(served)
    with torch.no_grad():
        for p in at_rounding.model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    after, grads = _step(served, [g])
    _, expected = _step(at_rounding, [g])
    for k in expected:
        assert torch.equal(grads[k], expected[k]), k
    assert not served.served.rounded
    # the update went to the masters: float32 values a bfloat16 rounding would not keep
    moved = [k for k in after if not torch.equal(after[k], masters[k])]
    assert moved and any(not torch.equal(after[k], after[k].to(torch.bfloat16).float()) for k in moved)
    assert _learner().served.params == []  # float32 versions: no copies
