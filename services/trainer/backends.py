"""Trainer backends: what the learner trains, behind one small interface (``trainer.backend``).

The learner (``services.trainer.learner``) owns the RL mechanism (groups, micro-batches, the
objective, normalisation, clipping, the optimizer step) and is the same for every backend. A
backend owns the model's representation:

- ``module``: the trained network, called as ``module(input_ids=..., attention_mask=...)`` and
  returning an object with ``.logits`` ``[B, T, V]`` (the Hugging Face convention
  ``services.policy.batch.token_logprobs`` uses); its parameters are what the optimizer steps;
- ``ref``: a frozen copy of the starting weights for the KL term (``trainer.kl_coef > 0``, else
  None), called like ``module`` and laid out like it (sharded too under data parallelism);
- ``weights()``: the full weights under their Hugging Face names as a ``WeightStream``: the
  specs first (no data), then one full tensor at a time. Under data parallelism every rank
  draws the stream in the same order (each tensor is a collective), and a consumer keeps a
  tensor only until it draws the next, so no rank ever holds a second full copy of the model.

``torch`` (``TorchBackend``): the Hugging Face model itself, float32 master weights on
``trainer.device``, FSDP2-sharded over the ranks (``services.trainer.parallel.shard``).
``megatron``: ``services.trainer.megatron`` (registered on import).
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, ClassVar

import torch

from services.common.registry import Registry
from services.common.weights import TensorSpec, WeightStream, dtype_name
from services.trainer.device import place_model

if TYPE_CHECKING:
    from services.common.config import RunConfig
    from services.policy.model import Policy
    from services.trainer.parallel import ParallelContext


class TrainBackend(ABC):
    name: ClassVar[str]
    module: torch.nn.Module
    ref: torch.nn.Module | None
    device: torch.device

    @abstractmethod
    def hf_specs(self) -> dict[str, TensorSpec]:
        """Names, dtypes and shapes of the full Hugging Face state, in stream order (no collective)."""

    @abstractmethod
    def hf_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The full tensors by Hugging Face name, in ``hf_specs`` order, each valid until the next."""

    def weights(self) -> WeightStream:
        return WeightStream(self.hf_specs(), self.hf_tensors())


BACKENDS: Registry[Callable[..., TrainBackend]] = Registry("trainer backend")
register_backend = BACKENDS.register


def create_backend(cfg: RunConfig, policy: Policy, parallel: ParallelContext | None = None) -> TrainBackend:
    """The configured backend over ``policy`` (its Hugging Face model is the starting point)."""
    name = cfg.trainer.backend
    if name == "megatron":
        import services.trainer.megatron  # noqa: F401  (registers itself; imports megatron-core)
    return BACKENDS[name](cfg, policy, parallel)


def full_tensor(value: torch.Tensor) -> torch.Tensor:
    """A DTensor shard's full tensor (an all-gather every rank makes), or the tensor itself."""
    return value.full_tensor() if hasattr(value, "full_tensor") else value


@register_backend("torch")
class TorchBackend(TrainBackend):
    """The Hugging Face model as it is; FSDP2 over the ranks when data parallel."""

    name = "torch"

    def __init__(self, cfg: RunConfig, policy: Policy, parallel: ParallelContext | None = None) -> None:
        from services.trainer.parallel import shard

        self.module = policy.model
        self.device = place_model(self.module, cfg.trainer, parallel.local_rank if parallel else None)
        self.ref = copy.deepcopy(self.module).eval().requires_grad_(False) if cfg.trainer.kl_coef > 0 else None
        if parallel is not None:
            for module in (self.module, self.ref):
                if module is not None:
                    shard(module, parallel, self.device)

    def hf_specs(self) -> dict[str, TensorSpec]:
        return {k: TensorSpec(dtype_name(v.dtype), tuple(v.shape)) for k, v in self.module.state_dict().items()}

    def hf_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, value in self.module.state_dict().items():
            yield name, full_tensor(value).detach()
