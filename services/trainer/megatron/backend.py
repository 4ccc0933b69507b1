"""``trainer.backend: megatron``: the policy trained as a megatron-core ``GPTModel`` (one rank).

The Hugging Face policy is converted once at start (``bridge``), trained in Megatron's layout
through the learner's usual loop (plain torch parameters, so the learner's AdamW and gradient
clipping apply unchanged), and converted back tensor by tensor whenever weights are pushed, under
the Hugging Face names and in the Hugging Face state-dict order, so every consumer (relays,
generation engines, checkpoints) sees the same stream as from the torch backend.

Megatron's model-parallel state is process-global: the first backend of a process starts a
single-rank process group (gloo on CPU, NCCL on CUDA; a loopback TCP store on a free port) and
``initialize_model_parallel(1, 1)``; later backends reuse it. Tensor and pipeline parallelism and
Megatron's data parallelism are not wired up (``trainer.ranks`` must be 1).

CUDA is megatron-core 0.16's platform: its rotary embeddings move their frequencies to
``torch.cuda.current_device()`` and attention forks the CUDA RNG tracker even with no dropout.
On CPU it runs only under the test shims (``tests/megatron_shims.py``), which never ship here;
without them the backend fails at creation with ``MegatronDeviceError`` saying so.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from services.common.weights import TensorSpec, dtype_name
from services.trainer.backends import TrainBackend, register_backend
from services.trainer.device import resolve_device
from services.trainer.megatron.bridge import Geometry, build_gpt, geometry, load_into, to_hf

if TYPE_CHECKING:
    from services.common.config import RunConfig
    from services.common.trainer_config import TrainerConfig
    from services.policy.model import Policy
    from services.trainer.parallel import ParallelContext


class MegatronDeviceError(RuntimeError):
    """megatron-core cannot run on the configured device (CPU without the test shims)."""


@dataclass
class LMOutput:
    """What ``services.policy.batch.token_logprobs`` reads of a causal LM's output."""

    logits: torch.Tensor  # [B, T, V]


def megatron_mask(attention_mask: torch.Tensor | None, length: int, device: torch.device) -> torch.Tensor:
    """Megatron's attention mask, ``[B or 1, 1, T, T]`` bool where True means *not* attended
    (0.16.1's ``attention_mask_func`` fills True positions with -10000 before the softmax):
    causal, plus the padding keys of ``attention_mask`` (1 = token, 0 = padding). With right
    padding no real query sees a padding key anyway; masking them keeps any padding exact."""
    causal = torch.ones(length, length, dtype=torch.bool, device=device).triu(1)[None, None]
    if attention_mask is None:
        return causal
    return causal | (attention_mask == 0)[:, None, None, :]


class MegatronCausalLM(nn.Module):
    """A ``GPTModel`` called like a Hugging Face causal LM: ``(input_ids, attention_mask)`` ->
    ``.logits`` ``[B, T, V]``. Positions are 0..T-1 per row (right padding, as the learner packs)."""

    def __init__(self, gpt: nn.Module) -> None:
        super().__init__()
        self.gpt = gpt

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> LMOutput:
        batch, length = input_ids.shape
        positions = torch.arange(length, device=input_ids.device).expand(batch, length)
        mask = megatron_mask(attention_mask, length, input_ids.device)
        return LMOutput(self.gpt(input_ids=input_ids, position_ids=positions, attention_mask=mask))


def start_model_parallel(device: torch.device, seed: int) -> None:
    """A single-rank process group and Megatron's model-parallel state (TP = PP = 1), unless this
    process has them already; on CUDA also Megatron's RNG tracker, seeded with ``seed``."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker, model_parallel_cuda_manual_seed

    if device.type == "cuda":
        torch.cuda.set_device(device)  # megatron places buffers and RoPE on the current device
    if not dist.is_initialized():
        store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=datetime.timedelta(minutes=10))
    if dist.get_world_size() != 1:
        raise ValueError(f"trainer.backend megatron trains on one rank; this process group has {dist.get_world_size()}")
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    if device.type == "cuda" and not get_cuda_rng_tracker().is_initialized():
        model_parallel_cuda_manual_seed(seed)  # megatron's required seeding; it reads the CUDA RNG


def check_settings(tc: TrainerConfig, device: torch.device, parallel: ParallelContext | None) -> None:
    """Refuse what this backend does not do, before anything is built."""
    if parallel is not None and parallel.world > 1:
        raise ValueError("trainer.backend megatron trains one rank (its data parallelism is not wired up)")
    if tc.dtype == "bfloat16" and device.type != "cuda":
        raise ValueError(
            "trainer.dtype bfloat16 with trainer.backend megatron needs CUDA: megatron-core's linear layers "
            "re-enter autocast in backward for CUDA autocast only, so a CPU backward mixes bfloat16 and float32"
        )


def check_runs_here(module: MegatronCausalLM, device: torch.device) -> None:
    """On CPU: a two-token forward, turning megatron-core 0.16's CUDA-only code paths into a
    clear error instead of a failure deep inside the first training step."""
    if device.type != "cpu":
        return
    ids = torch.zeros(1, 2, dtype=torch.long, device=device)
    try:
        with torch.no_grad():
            module(ids, torch.ones_like(ids))
    except Exception as err:
        raise MegatronDeviceError(
            "trainer.backend megatron on CPU: megatron-core 0.16 needs CUDA here (its rotary embeddings "
            "move to torch.cuda.current_device() and attention forks the CUDA RNG tracker); CPU runs only "
            f"under the test shims (tests/megatron_shims.py). Use trainer.device=cuda. ({type(err).__name__}: {err})"
        ) from err


@register_backend("megatron")
class MegatronBackend(TrainBackend):
    """A megatron-core ``GPTModel`` converted from the policy's Hugging Face model; float32 master
    weights on ``trainer.device``; weights streamed back under the Hugging Face names."""

    name = "megatron"

    def __init__(self, cfg: RunConfig, policy: Policy, parallel: ParallelContext | None = None) -> None:
        tc = cfg.trainer
        self.device = resolve_device(tc.device)
        check_settings(tc, self.device, parallel)
        self.geometry: Geometry = geometry(policy.model.config)
        hf_state = policy.model.state_dict()
        self._hf_shapes = {name: tuple(value.shape) for name, value in hf_state.items()}
        start_model_parallel(self.device, tc.seed)
        self.module = self._build(hf_state, recompute=tc.activation_checkpointing)
        check_runs_here(self.module, self.device)
        self.ref = None
        if tc.kl_coef > 0:
            self.ref = self._build(hf_state, recompute=False).eval().requires_grad_(False)

    def _build(self, hf_state: dict[str, torch.Tensor], recompute: bool) -> MegatronCausalLM:
        """A GPTModel holding ``hf_state``, in float32 on the device."""
        gpt = build_gpt(self.geometry, recompute=recompute)
        load_into(gpt, hf_state, self.geometry)
        return MegatronCausalLM(gpt).to(device=self.device, dtype=torch.float32)

    def hf_specs(self) -> dict[str, TensorSpec]:
        dtype = dtype_name(next(self.module.parameters()).dtype)
        return {name: TensorSpec(dtype, shape) for name, shape in self._hf_shapes.items()}

    def hf_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        params = dict(self.module.gpt.named_parameters())
        for name, value in to_hf(params, self.geometry, self._hf_shapes):
            yield name, value.detach()
