"""Data parallelism of the trainer: ranks, FSDP2 sharding, and the leader/follower protocol.

``trainer.ranks = N`` starts N trainer processes with torchrun's environment (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``); ``torch.distributed`` runs
over gloo on CPU and NCCL on CUDA, and every rank holds a ``fully_shard`` (FSDP2) shard of the
policy: each decoder layer is one unit, the rest of the model the root.

Rank 0, the *leader*, is the trainer as with one process: it reads the sample stream, scores
groups, keeps the staleness protocol, batches dynamically and publishes weights. Its learner is
a ``Leader``: each call (``begin``, ``backward``, ``step``, ``weights``) is broadcast to the
*followers* (ranks 1..N-1, ``follow``), which make the same call on their share of the groups
(``state``/``load_state``: a recovery checkpoint's full state, gathered to and broadcast from
the leader).
``split_groups`` deals complete groups out by tokens (longest first to the least-loaded rank), so
no sample is lost or trained twice, and the learner's normalisation at ``step`` (the global
sample or token count) makes the update that of the whole batch whatever the split.
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass
from typing import NoReturn

import torch

from services.common.entry import exit_process

log = logging.getLogger("braid.trainer")
# Followers wait for the leader's next command while it generates: a long wait is normal.
COMMAND_TIMEOUT = datetime.timedelta(hours=6)


@dataclass(frozen=True)
class ParallelContext:
    rank: int
    world: int
    local_rank: int

    @property
    def leader(self) -> bool:
        return self.rank == 0


def context_from_env(env: dict[str, str] | None = None) -> ParallelContext | None:
    """The rank of this process from torchrun's variables; None for a single process."""
    env = os.environ if env is None else env
    world = int(env.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    rank = int(env["RANK"])
    if not 0 <= rank < world:
        raise ValueError(f"RANK {rank} is outside WORLD_SIZE {world}")
    return ParallelContext(rank, world, int(env.get("LOCAL_RANK", str(rank))))


def init_process_group(ctx: ParallelContext, device: torch.device) -> None:
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL's buffers and object collectives use the current device
    dist.init_process_group(backend, rank=ctx.rank, world_size=ctx.world, timeout=COMMAND_TIMEOUT)
    log.info("rank %d of %d (%s on %s)", ctx.rank, ctx.world, backend, device)


def shutdown(code: int = 0) -> NoReturn:
    """End a rank's process once its work is done: wait for every rank, leave the process group,
    flush, and exit without the interpreter's teardown. Destroying the group and then exiting
    normally still aborted 2 of ~20 benchmark ranks here at exit ("terminate called without an
    active exception", SIGABRT; a native thread outliving the group, cause not pinned down), and
    the launcher would read that as a failed run."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    exit_process(code)


def shard(model: torch.nn.Module, ctx: ParallelContext, device: torch.device) -> None:
    """FSDP2 over all ranks: one unit per decoder layer, the embeddings, norm and head in the root
    (with LoRA, a layer's frozen base weights and trained adapter share its unit)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (ctx.world,))
    # a peft model (trainer.lora): the decoder layers are its base model's; the wrapper is the root
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = getattr(getattr(base, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no model.layers to shard (Qwen2/Llama-style decoders only)")
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def split_groups(groups: list, world: int, size=None) -> list[list]:
    """Deal groups to ``world`` ranks, largest first to the least-loaded rank (ties: lowest rank);
    ``size(group)`` defaults to the group's prompt + completion tokens. Every group goes to exactly
    one rank, and each rank keeps the groups' arrival order."""
    size = size or (lambda g: sum(len(s.prompt_token_ids) + len(s.token_ids) for s in g.samples))
    loads = [0] * world
    owner: dict[int, int] = {}
    for i in sorted(range(len(groups)), key=lambda i: (-size(groups[i]), i)):
        rank = min(range(world), key=lambda r: (loads[r], r))
        owner[i] = rank
        loads[rank] += size(groups[i])
    return [[g for i, g in enumerate(groups) if owner[i] == r] for r in range(world)]


def _comm_device() -> torch.device:
    """Where small collective tensors live: NCCL reduces only CUDA tensors, gloo host ones."""
    import torch.distributed as dist

    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def sum_across(values: list[float]) -> list[float]:
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def max_across(value: int) -> int:
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.int64, device=_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def _broadcast(command: tuple | None) -> tuple:
    import torch.distributed as dist

    box = [command]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class Leader:
    """Rank 0's learner: the ``Learner`` interface, each call mirrored on every follower."""

    def __init__(self, learner, ctx: ParallelContext) -> None:
        self.learner, self.ctx = learner, ctx

    @property
    def model(self) -> torch.nn.Module:
        return self.learner.model

    @property
    def stats(self):
        return self.learner.stats

    def begin(self):
        _broadcast(("begin",))
        return self.learner.begin()

    def backward(self, groups: list) -> None:
        shares = split_groups(groups, self.ctx.world)
        _broadcast(("backward", shares))
        self.learner.backward(shares[0])

    def step(self) -> float:
        _broadcast(("step",))
        return self.learner.step()

    def weights(self):
        """The full weights as a ``WeightStream``: draw all of it (each tensor is a collective)."""
        _broadcast(("weights",))
        return self.learner.weights()

    def state(self) -> dict:
        """The learner's full state, gathered from every rank (``Learner.state``)."""
        _broadcast(("state",))
        return self.learner.state()

    def load_state(self, state: dict) -> None:
        """Install a full state on every rank (``Learner.load_state``)."""
        _broadcast(("load",))
        self.learner.load_state(state)

    def close(self) -> None:
        _broadcast(("stop",))


def follow(learner, ctx: ParallelContext) -> int:
    """A follower's life: make the leader's calls on this rank's share until it says stop;
    returns the number of commands served."""
    served = 0
    while True:
        command = _broadcast(None)
        served += 1
        name = command[0]
        if name == "stop":
            return served
        if name == "begin":
            learner.begin()
        elif name == "backward":
            learner.backward(command[1][ctx.rank])
        elif name == "step":
            learner.step()
        elif name == "weights":
            for _ in learner.weights().tensors:  # the all-gathers; only the leader keeps the tensors
                pass
        elif name == "state":
            learner.state()  # the gathers; only the leader keeps the state
        elif name == "load":
            learner.load_state(None)  # this rank's shard of the leader's broadcast
        else:
            raise RuntimeError(f"rank {ctx.rank}: unknown command {name!r} from the leader")
