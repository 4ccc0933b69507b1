"""``trainer.backend: megatron`` on a CUDA device, no shims (skipped without one; ``make test-gpu``).

megatron-core's intended platform: the RNG tracker seeded by ``model_parallel_cuda_manual_seed``,
RoPE on the current device, autocast to bfloat16 restored in its linear layers' backward, full
activation recomputation. Not run yet: no GPU has been lent to this project's sessions so far.
"""

from __future__ import annotations

import pytest
import torch

from services.common.config import RunConfig, WeightsConfig
from services.common.weights import specs_of
from services.policy.model import build_policy
from services.run.transport import DirectTransport
from services.trainer.learner import Learner
from tests.megatron_shims import megatron_clean, megatron_or_skip  # noqa: F401 (fixture)
from tests.unit.test_learner import MODEL, _groups

pytestmark = pytest.mark.gpu

megatron_or_skip()


def _learner(backend: str, **trainer) -> tuple[Learner, dict[str, torch.Tensor]]:
    cfg = RunConfig.model_validate(
        {"model": MODEL, "trainer": {"backend": backend, "device": "cuda", "lr": 1e-2, **trainer}}
    )
    torch.manual_seed(0)
    policy = build_policy(cfg.model)
    start = {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
    return Learner(cfg, policy), start


def _step_and_snapshot(learner: Learner) -> dict[str, torch.Tensor]:
    learner.begin()
    learner.backward(_groups())
    learner.step()
    return DirectTransport(WeightsConfig()).snapshot(learner.weights())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.usefixtures("megatron_clean")
def test_a_megatron_cuda_step_matches_the_torch_cuda_step(dtype):
    megatron, start = _learner("megatron", dtype=dtype)
    assert next(megatron.model.parameters()).device.type == "cuda"
    got = _step_and_snapshot(megatron)
    want = _step_and_snapshot(_learner("torch", dtype=dtype)[0])
    assert specs_of(got) == specs_of(start)  # Hugging Face names, order and shapes; float32 master weights
    assert all(v.device.type == "cpu" for v in got.values())
    moved_m = torch.cat([(got[k] - start[k]).flatten() for k in start])
    moved_t = torch.cat([(want[k].cpu() - start[k]).flatten() for k in start])
    assert torch.nn.functional.cosine_similarity(moved_m, moved_t, dim=0) > (0.999 if dtype == "float32" else 0.98)


@pytest.mark.usefixtures("megatron_clean")
def test_activation_recomputation_gives_the_same_step():
    plain = _step_and_snapshot(_learner("megatron", dtype="bfloat16")[0])
    recomputed = _step_and_snapshot(_learner("megatron", dtype="bfloat16", activation_checkpointing=True)[0])
    for k in plain:
        assert torch.allclose(recomputed[k], plain[k], atol=1e-3, rtol=1e-2), k


@pytest.mark.usefixtures("megatron_clean")
def test_a_kl_reference_on_cuda():
    learner, _ = _learner("megatron", kl_coef=0.1)
    assert learner.ref is not None and next(learner.ref.parameters()).device.type == "cuda"
    _step_and_snapshot(learner)
    learner.begin()
    learner.backward(_groups())
    assert learner.stats.kl > 0
