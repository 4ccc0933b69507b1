"""Padding and per-token log-probs of (prompt, completion) pairs, shared by SFT and RL."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from services.policy.bucketing import length_buckets  # noqa: F401  (the learner's micro-batching)


@dataclass
class PackedBatch:
    """Right-padded sequences. ``completion_mask[b, t]`` marks targets ``input_ids[b, t + 1]``
    that belong to the completion, aligned with ``logits[:, :-1]``."""

    input_ids: torch.Tensor  # [B, T] long
    attention_mask: torch.Tensor  # [B, T] long
    completion_mask: torch.Tensor  # [B, T-1] float

    @property
    def num_completion_tokens(self) -> int:
        return int(self.completion_mask.sum().item())


def pack(prompts: list[list[int]], completions: list[list[int]], pad_id: int,
         masks: list[tuple[int, ...]] | None = None) -> PackedBatch:
    """Concatenate each prompt with its completion and right-pad to the longest. ``masks[b]``
    (one 0/1 per completion token; empty = all 1) leaves completion tokens out of
    ``completion_mask``: a multi-turn trajectory's observation tokens are context, not targets."""
    if len(prompts) != len(completions) or not prompts:
        raise ValueError(f"need equal, non-empty lists (got {len(prompts)} prompts, {len(completions)} completions)")
    if masks is not None and len(masks) != len(completions):
        raise ValueError(f"{len(masks)} loss masks for {len(completions)} completions")
    lengths = [len(p) + len(c) for p, c in zip(prompts, completions, strict=True)]
    width = max(lengths)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(prompts), width), dtype=torch.long)
    cmask = torch.zeros((len(prompts), width - 1), dtype=torch.float32)
    for b, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        seq = p + c
        ids[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attn[b, : len(seq)] = 1
        # target position t+1 is completion token j when t+1 = len(p) + j
        mask = masks[b] if masks is not None else ()
        if mask:
            if len(mask) != len(c):
                raise ValueError(f"sequence {b}: loss mask of {len(mask)} for {len(c)} completion tokens")
            cmask[b, len(p) - 1 : len(seq) - 1] = torch.tensor(mask, dtype=torch.float32)
        else:
            cmask[b, len(p) - 1 : len(seq) - 1] = 1.0
    return PackedBatch(ids, attn, cmask)


def token_logprobs(model: PreTrainedModel, batch: PackedBatch, temperature: float = 1.0) -> torch.Tensor:
    """Log-prob of every next token under ``model``: shape [B, T-1] (mask with completion_mask).
    ``temperature``: of the distribution the tokens were sampled from (the logits are divided by
    it, as the engine does before sampling), so the trainer's log-probs and the engine's
    behaviour log-probs describe the same distribution."""
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    logits = out.logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    targets = batch.input_ids[:, 1:]
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def completion_values(batch: PackedBatch, prompt_lens: list[int], values: list[list[float]]) -> torch.Tensor:
    """Place per-completion-token values (e.g. behaviour log-probs) on ``completion_mask``'s grid."""
    out = torch.zeros_like(batch.completion_mask)
    for b, (plen, vals) in enumerate(zip(prompt_lens, values, strict=True)):
        out[b, plen - 1 : plen - 1 + len(vals)] = torch.tensor(vals, dtype=out.dtype)
    return out
