"""Where and in what precision the trainer computes (``trainer.device``, ``trainer.dtype``,
``trainer.activation_checkpointing``), and at which weights (``ServedWeights``).

Parameters, gradients and optimizer state stay float32 on the device (the master weights);
``bfloat16`` runs forward and backward under ``torch.autocast``, so pushed weights are float32
whatever the compute precision, and generation engines cast them to their serving dtype. With
versions that travel in bfloat16 or float16 (``weights.dtype``), forward and backward run at the
rounding of the masters the SGS serves (``ServedWeights``).
"""

from __future__ import annotations

import contextlib

import torch

from services.common.config import TrainerConfig


class DeviceError(RuntimeError):
    """The configured trainer device does not exist on this machine."""


def resolve_device(spec: str, local_rank: int | None = None) -> torch.device:
    """``trainer.device`` → a torch device that exists here, or ``DeviceError`` saying why not.
    ``local_rank``: a data-parallel rank's index on its host; plain ``cuda`` then means its own GPU."""
    device = torch.device(spec)
    if device.type == "cuda" and device.index is None and local_rank is not None:
        device = torch.device("cuda", local_rank)
    if device.type == "cpu":
        return device
    if not torch.cuda.is_available():
        raise DeviceError(
            f"trainer.device is {spec!r} but this machine has no usable CUDA device "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); use trainer.device=cpu"
        )
    count = torch.cuda.device_count()
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index >= count:
        raise DeviceError(
            f"trainer.device is {spec!r} but this machine has {count} CUDA device(s) (cuda:0..cuda:{count - 1})"
        )
    return torch.device("cuda", index)


def compute_context(device: torch.device, dtype: str) -> contextlib.AbstractContextManager:
    """The context forward/backward run in: autocast to bfloat16, or nothing for float32."""
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def place_model(model: torch.nn.Module, tc: TrainerConfig, local_rank: int | None = None) -> torch.device:
    """Move ``model`` (float32) to the trainer's device and switch on activation checkpointing
    when configured; returns the device."""
    device = resolve_device(tc.device, local_rank)
    model.to(device=device, dtype=torch.float32)
    if tc.activation_checkpointing:
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise ValueError(f"{type(model).__name__} does not support activation checkpointing")
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    return device


class ServedWeights:
    """Forward and backward at the weights the generation engines serve, not at the float32 masters.

    With ``weights.dtype`` bfloat16 or float16, each version reaches the SGS rounded to that dtype,
    so the SGS samples from the rounding of the masters. Log-probs taken at the masters would differ
    from the behaviour log-probs by that rounding alone (0.006 nats a token, p99 0.035, on
    SmolLM2-135M: docs/weights.md), and the objective would read the difference as off-policy drift.
    ``enter`` rounds ``params`` in place (float32 storage) before a batch's first forward and keeps
    the masters aside; ``leave`` puts the masters back before the optimizer applies the gradients
    taken at the rounded point (a straight-through estimate, as mixed-precision training on GPUs
    takes its gradients at bfloat16 weights). With float32 versions it holds nothing and does nothing.
    """

    def __init__(self, params: list[torch.nn.Parameter], weights_dtype: str) -> None:
        self.params = params if weights_dtype != "float32" else []
        self.dtype: torch.dtype = getattr(torch, weights_dtype)
        self._masters: list[torch.Tensor] | None = None

    @property
    def rounded(self) -> bool:
        """Whether the parameters hold the served rounding now (between ``enter`` and ``leave``)."""
        return self._masters is not None

    @torch.no_grad()
    def enter(self) -> None:
        if self.rounded or not self.params:
            return
        self._masters = [p.detach().clone() for p in self.params]
        for p in self.params:
            p.copy_(p.to(self.dtype).to(p.dtype))

    @torch.no_grad()
    def leave(self) -> None:
        if self._masters is None:
            return
        for p, master in zip(self.params, self._masters, strict=True):
            p.copy_(master)
        self._masters = None
