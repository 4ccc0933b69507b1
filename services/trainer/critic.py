"""PPO's critic: the policy's transformer backbone (copied) with a scalar value head.

``values(batch)`` is aligned with ``PackedBatch.completion_mask``: entry ``[b, t]`` is the
value of the state before emitting the completion token at ``input_ids[b, t + 1]``. The head
starts at zero, so the first advantages are plain reward-to-go.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from services.policy.batch import PackedBatch


class ValueModel(nn.Module):
    def __init__(self, causal_lm: nn.Module) -> None:
        super().__init__()
        self.backbone = copy.deepcopy(causal_lm.model)  # Qwen2Model / LlamaModel of the CausalLM
        self.backbone.requires_grad_(True)
        self.head = nn.Linear(causal_lm.config.hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def values(self, batch: PackedBatch) -> torch.Tensor:
        """-> [B, T-1] values on the completion grid."""
        hidden = self.backbone(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
        return self.head(hidden.float()).squeeze(-1)[:, :-1]
