"""Data parallelism: 2 trainer ranks (gloo, FSDP2 on CPU) make the update one process makes."""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.multiprocessing as mp

from flows.processes import free_port
from services.common.config import RunConfig
from services.policy.model import build_policy
from services.trainer.device import resolve_device
from services.trainer.learner import Group, Learner
from services.trainer.parallel import Leader, context_from_env, follow, init_process_group, shutdown
from tests.unit.test_learner import MODEL, _groups, _sample

TRAINER = {"lr": 1e-2, "algorithm": {"loss_agg": "token_mean"}}


def _batches() -> list[list[Group]]:
    """Two backward calls: the first splits 3 groups of unequal size over 2 ranks (one holds the
    zero-advantage group, so the ranks make different numbers of passes), the second one group
    (a rank with nothing to do)."""
    extra = Group([_sample("d", 0, 9), _sample("d", 1, 2), _sample("d", 2, 6)], [0.0, 1.0, 0.0])
    return [_groups(), [extra]]


def _config(**trainer) -> RunConfig:
    return RunConfig.model_validate({"model": MODEL, "trainer": {**TRAINER, **trainer}})


def _leader(rank: int, world: int, port: int, kl_coef: float = 0.0, device: str = "cpu", **trainer) -> Leader:
    """This spawned process as rank ``rank``: a follower serves the leader and exits here; the
    leader gets its ``Leader``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    ctx = context_from_env()
    cfg = _config(ranks=world, kl_coef=kl_coef, device=device, **trainer)
    init_process_group(ctx, resolve_device(device, ctx.local_rank))
    torch.manual_seed(0)
    learner = Learner(cfg, build_policy(cfg.model), ctx)
    if not ctx.leader:
        follow(learner, ctx)
        shutdown()  # exits
    return Leader(learner, ctx)


def _rank(rank: int, world: int, port: int, out: str, kl_coef: float = 0.0, device: str = "cpu") -> None:
    leader = _leader(rank, world, port, kl_coef, device)
    stats = leader.begin()
    for batch in _batches():
        leader.backward(batch)
    grad_norm = leader.step()
    state = leader.weights().host_copies()
    leader.close()
    torch.save({"state": state, "grad_norm": grad_norm, "loss": stats.loss, "trained": stats.trained_samples,
                "zero_adv": stats.zero_adv_groups, "micro_batches": stats.micro_batches}, out)
    shutdown()



def _one_process_step(cfg):
    """(learner, stats, grad norm) of the same step in one process, seeded as the ranks are."""
    torch.manual_seed(0)
    single = Learner(cfg, build_policy(cfg.model))
    stats = single.begin()
    for batch in _batches():
        single.backward(batch)
    return single, stats, single.step()


def _spawn_ranks(target, *args) -> None:
    """Run ``target(rank, 2, port, *args)`` as 2 spawned ranks; both must exit 0."""
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, 2, port, *args)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
        assert p.exitcode == 0, f"a rank failed (exit {p.exitcode})"


# with a KL term the reference model is sharded too: in make test-long (two more spawned ranks, ~25 s of CPU)
@pytest.mark.parametrize("kl_coef", [0.0, pytest.param(0.05, marks=pytest.mark.long)])
def test_two_ranks_make_the_single_process_update(tmp_path, kl_coef):
    check_two_ranks(tmp_path, kl_coef, "cpu")


def check_two_ranks(tmp_path, kl_coef: float, device: str) -> None:
    """2 ranks on ``device`` (gloo on CPU, NCCL on 2 GPUs) against one CPU process."""
    out = tmp_path / "rank0.pt"
    _spawn_ranks(_rank, str(out), kl_coef, device)
    dp = torch.load(out, map_location="cpu")

    cfg = _config(kl_coef=kl_coef)
    single, stats, grad_norm = _one_process_step(cfg)

    # without KL the zero-advantage group is skipped; with it every group trains
    assert dp["trained"] == stats.trained_samples == (8 if kl_coef == 0 else 10)
    assert dp["zero_adv"] == stats.zero_adv_groups == (1 if kl_coef == 0 else 0)
    rel = 1e-5 if device == "cpu" else 1e-3  # CUDA's kernels round differently
    assert dp["loss"] == pytest.approx(stats.loss, rel=rel, abs=1e-7)
    assert dp["grad_norm"] == pytest.approx(grad_norm, rel=rel)
    state = single.model.state_dict()
    grads = {n: p.grad for n, p in single.model.named_parameters()}
    assert dp["state"].keys() == state.keys()
    for name, value in state.items():
        assert dp["state"][name].dtype == torch.float32
        # AdamW's first update is lr * g / (|g| + 1e-8): where g is round-off (exactly 0 in exact
        # arithmetic) it moves by +-lr either way, so compare where the gradient is real
        real = grads[name if name in grads else "model.embed_tokens.weight"].abs() > 1e-6
        assert torch.allclose(dp["state"][name][real], value[real],
                              atol=1e-6 if device == "cpu" else 1e-4, rtol=1e-5), name
    moved = build_policy(cfg.model).model.state_dict()  # not vacuous: the step moved the weights
    assert any(not torch.allclose(moved[n], state[n]) for n in state)


def _rank_recovery(rank: int, world: int, port: int, out: str) -> None:
    """Step, take the gathered recovery state, step again; install the state, take the same step:
    the two second steps must agree (weights and AdamW moments restored on every rank's shard)."""
    leader = _leader(rank, world, port)

    def step(batch):
        leader.begin()
        leader.backward(batch)
        leader.step()
        return leader.weights().host_copies()

    first, second = _batches()
    step(first)
    saved = copy.deepcopy(leader.state())  # as a checkpoint is written at once (AdamW's step count is a live tensor)
    once = step(second)
    leader.load_state(saved)
    again = step(second)
    leader.close()
    torch.save({"once": once, "again": again, "saved": saved}, out)
    shutdown()


@pytest.mark.long  # `make test-long` (CI runs it; docs/testing.md)
def test_two_ranks_restore_a_gathered_recovery_state(tmp_path):
    out = tmp_path / "rank0.pt"
    _spawn_ranks(_rank_recovery, str(out))
    got = torch.load(out, map_location="cpu", weights_only=False)
    assert got["once"].keys() == got["again"].keys()
    assert all(torch.equal(got["once"][k], got["again"][k]) for k in got["once"])
    full = build_policy(_config().model).model.state_dict()
    assert got["saved"]["module"].keys() == full.keys()  # full tensors, by name
    assert all(got["saved"]["module"][k].shape == full[k].shape for k in full)
    assert got["saved"]["opt"]["state"]  # AdamW moments, gathered


LORA = {"rank": 4, "alpha": 8.0}


def _rank_lora(rank: int, world: int, port: int, out: str) -> None:
    """A LoRA adapter with a KL term over 2 ranks: a step and the adapter stream; the gathered
    recovery state; another step, then that state installed and the same step again."""
    leader = _leader(rank, world, port, kl_coef=0.05, lora=LORA)

    def step():
        stats = leader.begin()
        for batch in _batches():
            leader.backward(batch)
        return stats, leader.step(), leader.weights().host_copies()

    stats, grad_norm, first = step()
    saved = copy.deepcopy(leader.state())
    once = step()[2]
    leader.load_state(saved)
    again = step()[2]
    leader.close()
    torch.save({"first": first, "once": once, "again": again, "grad_norm": grad_norm, "loss": stats.loss}, out)
    shutdown()


@pytest.mark.slow  # ~50 s here (two spawned ranks build FSDP2 twice over); the single-process LoRA tests are fast
def test_two_ranks_train_a_lora_adapter(tmp_path):
    """FSDP2 over a peft model: 2 ranks make the single-process LoRA update (adapter tensors only,
    the reference is the base), and a gathered recovery state restores the adapter and its moments."""
    out = tmp_path / "rank0.pt"
    _spawn_ranks(_rank_lora, str(out))
    dp = torch.load(out, map_location="cpu", weights_only=False)

    cfg = _config(kl_coef=0.05, lora=LORA)
    single, stats, grad_norm = _one_process_step(cfg)
    assert dp["loss"] == pytest.approx(stats.loss, rel=1e-5, abs=1e-7)
    assert dp["grad_norm"] == pytest.approx(grad_norm, rel=1e-5) and grad_norm > 0
    want = single.weights().host_copies()
    assert list(dp["first"]) == list(want) and all(".lora_" in k for k in want)
    for name, value in want.items():
        assert torch.allclose(dp["first"][name], value, atol=1e-6, rtol=1e-5), name
        assert torch.equal(dp["again"][name], dp["once"][name]), name
    assert any(not torch.equal(dp["once"][k], dp["first"][k]) for k in want)  # not vacuous: the second step moved
