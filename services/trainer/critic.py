"""PPO's critic: the policy's transformer backbone (copied) with a scalar value head.

The backbone is a deep copy of the CausalLM's base model (``causal_lm.model``: Qwen2Model,
LlamaModel, ...), so the critic starts from the policy's representation, as in InstructGPT-
style PPO where the value model is initialised from a pretrained LM; it then trains on its own
(own optimizer, no shared parameters). ``values(batch)`` is aligned with
``PackedBatch.completion_mask``: entry ``[b, t]`` is V(s_t), the value of the prefix
``input_ids[b, : t + 1]``, i.e. of the state before emitting the token ``input_ids[b, t + 1]``.
The head starts at zero, so the first advantages are plain reward-to-go.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from services.policy.batch import PackedBatch


class ValueModel(nn.Module):
    def __init__(self, causal_lm: nn.Module) -> None:
        super().__init__()
        self.backbone = copy.deepcopy(causal_lm.model).requires_grad_(True)
        device = next(self.backbone.parameters()).device
        self.head = nn.Linear(causal_lm.config.hidden_size, 1, device=device, dtype=torch.float32)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def values(self, batch: PackedBatch) -> torch.Tensor:
        """input_ids [B, T] -> values [B, T-1] (float32) on the completion grid."""
        out = self.backbone(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
        return self.head(out.last_hidden_state.float()).float().squeeze(-1)[:, :-1]  # float32 under autocast too
