"""Where and in what precision the trainer computes (``trainer.device``, ``trainer.dtype``,
``trainer.activation_checkpointing``).

Parameters, gradients and optimizer state stay float32 on the device (the master weights);
``bfloat16`` runs forward and backward under ``torch.autocast``, so pushed weights are float32
whatever the compute precision, and generation engines cast them to their serving dtype.
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
