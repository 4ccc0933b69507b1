"""``trainer.lora``: the LoRA adapter a run trains (schema only; ``services.common.lora`` does the work)."""

from __future__ import annotations

from pydantic import Field

from services.common.strict import StrictModel

# Every projection of a Llama/Qwen/Mistral-style decoder layer (attention and MLP).
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraConfig(StrictModel):
    """A LoRA adapter over the policy's linear layers (``trainer.lora``; None = full fine-tuning)."""

    rank: int = Field(16, ge=1, le=512, description="Adapter rank r.")
    alpha: float = Field(32.0, gt=0.0, le=16384.0, description="LoRA alpha: the update is scaled by alpha / rank.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the adapter's input while training.")
    target_modules: list[str] = Field(
        default_factory=lambda: list(DEFAULT_TARGETS), min_length=1, max_length=64,
        description="Names of the linear modules that get an adapter (suffixes of module names, peft's rule).",
    )
