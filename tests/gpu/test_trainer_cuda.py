"""The trainer on a CUDA device (skipped without one; ``make test-gpu``)."""

from __future__ import annotations

import pytest
import torch

from services.common.config import WeightsConfig
from services.run.transport import DirectTransport
from tests.unit.test_learner import _groups, _step
from tests.unit.test_trainer_device import _learner

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_cuda_step_matches_the_cpu_step(dtype):
    g = _groups()
    _, on_cpu = _step(_learner(), [g])
    learner = _learner(device="cuda", dtype=dtype)
    assert next(learner.model.parameters()).device.type == "cuda"
    _, on_cuda = _step(learner, [g])
    flat_cpu = torch.cat([v.flatten() for v in on_cpu.values()])
    flat_cuda = torch.cat([v.flatten().cpu() for v in on_cuda.values()])
    assert all(v.dtype == torch.float32 for v in on_cuda.values())  # master weights and gradients
    assert torch.nn.functional.cosine_similarity(flat_cpu, flat_cuda, dim=0) > (0.9999 if dtype == "float32" else 0.99)


def test_activation_checkpointing_on_cuda_in_bfloat16():
    g = _groups()
    _, plain = _step(_learner(device="cuda", dtype="bfloat16"), [g])
    _, recomputed = _step(_learner(device="cuda", dtype="bfloat16", activation_checkpointing=True), [g])
    for k in plain:
        assert torch.allclose(recomputed[k], plain[k], atol=1e-3, rtol=1e-2), k


def test_weights_leave_a_cuda_trainer_as_float32_host_tensors():
    learner = _learner(device="cuda", dtype="bfloat16")
    snap = DirectTransport(WeightsConfig()).snapshot(learner.weights())
    assert all(v.device.type == "cpu" and v.dtype == torch.float32 for v in snap.values())


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL data parallel needs 2 GPUs (one per rank)")
def test_two_nccl_ranks_make_the_single_process_update(tmp_path):
    from tests.integration.test_data_parallel import check_two_ranks

    check_two_ranks(tmp_path, 0.05, "cuda")


def test_fsdp_on_one_gpu_makes_the_plain_cuda_update(monkeypatch):
    """FSDP2 over a one-rank NCCL group: the sharding, the summed statistics and the gathered
    weights, without a second GPU."""
    import torch.distributed as dist

    from flows.processes import free_port
    from services.trainer.parallel import ParallelContext, init_process_group

    g = _groups()
    plain = _learner(device="cuda")
    _step(plain, [g])
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    ctx = ParallelContext(rank=0, world=1, local_rank=0)
    init_process_group(ctx, torch.device("cuda", 0))
    try:
        sharded = _learner(ctx, device="cuda")
        assert all(hasattr(p, "full_tensor") for p in sharded.model.parameters())  # DTensor shards
        sharded.begin()
        sharded.backward(g)
        sharded.step()
        want, got = plain.weights().host_copies(), sharded.weights().host_copies()
    finally:
        dist.destroy_process_group()
    for k in want:
        assert torch.allclose(got[k], want[k], atol=1e-5, rtol=1e-4), k


def test_a_cuda_trainer_pushes_to_a_relay(tmp_path):
    from tests.integration.test_trainer_push import check_push_to_relay

    check_push_to_relay(tmp_path, device="cuda", dtype="bfloat16")
