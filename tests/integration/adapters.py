"""Helpers for the LoRA tests: random adapters and the merged model they should behave as."""

from __future__ import annotations

from pathlib import Path

import torch

from services.common.lora import LoraConfig, adapter_state, wrap


def load_reference(checkpoint: Path):
    """The checkpoint in transformers, float32, eval mode: the reference engines are checked against."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(checkpoint, local_files_only=True, dtype=torch.float32).eval()


def random_adapter(checkpoint: Path, cfg: LoraConfig, seed: int, scale: float = 0.4):
    """(adapter state under peft's saved names, base + adapter merged by peft's ``merge_and_unload``):
    ``lora_A`` and ``lora_B`` drawn from N(0, scale²), large enough on the tiny model to change
    greedy outputs."""
    model = wrap(load_reference(checkpoint), cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
    state = {k: v.detach().clone() for k, v in adapter_state(model).items()}
    return state, model.merge_and_unload().eval()


@torch.no_grad()
def ref_greedy(model, prompt: list[int], n: int) -> list[int]:
    """``n`` tokens of greedy decoding by full forward passes (no cache)."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]
