"""Trainer backends: what the learner trains, behind one small interface (``trainer.backend``).

The learner (``services.trainer.learner``) owns the RL mechanism (groups, micro-batches, the
objective, normalisation, clipping, the optimizer step) and is the same for every backend. A
backend owns the model's representation:

- ``module``: the trained network, called as ``module(input_ids=..., attention_mask=...)`` and
  returning an object with ``.logits`` ``[B, T, V]`` (the Hugging Face convention
  ``services.policy.batch.token_logprobs`` uses); its parameters are what the optimizer steps;
- ``ref``: a frozen copy of the starting weights for the KL term (``trainer.kl_coef > 0``, else
  None), called like ``module`` and laid out like it (sharded too under data parallelism);
- ``weights()``: the weights a version carries under their Hugging Face names as a
  ``WeightStream`` (the full model; with ``trainer.lora`` the adapter only): the
  specs first (no data), then one full tensor at a time. Under data parallelism every rank
  draws the stream in the same order (each tensor is a collective), and a consumer keeps a
  tensor only until it draws the next, so no rank ever holds a second full copy of the model.

``torch`` (``TorchBackend``): the Hugging Face model itself, float32 master weights on
``trainer.device``, FSDP2-sharded over the ranks (``services.trainer.parallel.shard``). With
``trainer.lora`` (``services.common.lora``) the model is wrapped by peft: the base is frozen and
only the adapter trains; a version is the adapter's tensors under peft's saved names (what
``adapter_specs`` lists for the checkpoint); the KL reference is the same module run with the
adapter disabled (``AdapterDisabled``), so the base is held once.
``megatron``: ``services.trainer.megatron`` (registered on import).
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, ClassVar

import torch

from services.common.lora import adapter_state, wrap
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
        """Names, dtypes and shapes of the Hugging Face state a version carries, in stream order (no
        collective): the full model's, or with ``trainer.lora`` the adapter's (peft's saved names)."""

    @abstractmethod
    def hf_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The full tensors by Hugging Face name, in ``hf_specs`` order, each valid until the next."""

    def trainable(self) -> list[torch.nn.Parameter]:
        """The parameters the optimizer steps (all of them, or with LoRA the adapter's)."""
        return [p for p in self.module.parameters() if p.requires_grad]

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


class AdapterDisabled(torch.nn.Module):
    """The KL reference under LoRA: the policy's own peft model run with its adapter disabled (the
    base's output), in eval mode, without a second copy of the base: the model is held, not
    registered as a submodule, so moving or sharding this wrapper touches nothing."""

    def __init__(self, peft_model: torch.nn.Module) -> None:
        super().__init__()
        self.__dict__["peft_model"] = peft_model  # not a submodule: no parameters of its own

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]:
        """The base's parameters (frozen; the adapter's are off in ``forward``)."""
        return (p for p in self.peft_model.parameters(recurse) if not p.requires_grad)

    def forward(self, **inputs):
        model = self.peft_model
        training = model.training
        model.eval()
        try:
            with model.disable_adapter():
                return model(**inputs)
        finally:
            model.train(training)


@register_backend("torch")
class TorchBackend(TrainBackend):
    """The Hugging Face model as it is (or peft-wrapped with ``trainer.lora``); FSDP2 over the ranks
    when data parallel."""

    name = "torch"

    def __init__(self, cfg: RunConfig, policy: Policy, parallel: ParallelContext | None = None) -> None:
        from services.trainer.parallel import shard

        self.lora = cfg.trainer.lora
        self.device = place_model(policy.model, cfg.trainer, parallel.local_rank if parallel else None)
        self.module = policy.model if self.lora is None else wrap(policy.model, self.lora)
        self.ref: torch.nn.Module | None = None
        if cfg.trainer.kl_coef > 0:
            self.ref = (copy.deepcopy(self.module).eval().requires_grad_(False) if self.lora is None
                        else AdapterDisabled(self.module))
        if parallel is not None:
            shard(self.module, parallel, self.device)
            if self.lora is None and self.ref is not None:
                shard(self.ref, parallel, self.device)

    def _state(self) -> dict[str, torch.Tensor]:
        """The state a version carries (DTensor shards when sharded): the model's, or the adapter's."""
        return self.module.state_dict() if self.lora is None else adapter_state(self.module)

    def hf_specs(self) -> dict[str, TensorSpec]:
        return {k: TensorSpec(dtype_name(v.dtype), tuple(v.shape)) for k, v in self._state().items()}

    def hf_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, value in self._state().items():
            yield name, full_tensor(value).detach()
