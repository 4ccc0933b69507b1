"""Per-sequence attention for transformers' continuous batching on CPU (``generation.attention = "varlen"``).

Continuous batching packs every running sequence into one row: the queries of all sequences
(``cu_seq_lens_q``) against the cached keys of all sequences (``cu_seq_lens_k``). Its SDPA path
attends every query to *every* cached token under a block-diagonal mask, so one decode step
of n sequences holding kv cached tokens in total costs O(n x kv) = O(n^2 x context): past
~32 sequences a bigger batch decodes fewer tokens per second (the ``k5`` term of
``scheduling.cost``). Flash attention's varlen kernels avoid this on GPUs; on CPU there is
none. ``varlen_sdpa`` pads each sequence's queries and keys into a batch of their own
([n, heads, longest q, longest k]) and runs one SDPA call with a causal-and-padding mask, so a
step costs O(n x longest context). Outputs match the dense path (same tokens from the same
seed, log-probs within float rounding: ``tests/integration/test_varlen_engine.py``; the padded
attention against one-sequence-at-a-time attention: ``tests/unit/test_varlen_attention.py``).

It is installed in the SGS process under transformers' ``"sdpa"`` key (the continuous-batching
manager accepts only ``sdpa``, ``paged|eager`` or flash kernels); any call that is not a
continuous-batching step (no paged cache, no sequence offsets, a position bias) goes to the
stock implementation unchanged, and so does a step of at most ``DENSE_UP_TO`` sequences.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.generation.continuous_batching.cache import PagedAttentionCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

# Up to this many sequences in a step the stock path is used: it is as fast or faster there
# (engine alone, tiny model, this repository's CPU, medians of three runs: the padded path gave
# 0.77x its tokens/s at 16 sequences, 1.07x at 32, 1.49x at 64, 2.28x at 128).
DENSE_UP_TO = 16


def padded_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
    scaling: float | None = None,
) -> torch.Tensor:
    """Causal attention of packed sequences, each against its own keys.

    query: [1, H, Tq, D]; key, value: [1, Hkv, Tk, D] (H a multiple of Hkv); cu_q, cu_k: [n + 1]
    cumulative offsets of each sequence's queries and keys. A sequence's q queries are its last
    q positions: query i sees keys j <= k_len - q_len + i. Returns [1, Tq, H, D]."""
    q_lens, k_lens = cu_q[1:] - cu_q[:-1], cu_k[1:] - cu_k[:-1]
    ar_q = torch.arange(int(q_lens.max()), device=query.device)
    ar_k = torch.arange(int(k_lens.max()), device=query.device)
    valid_q = ar_q[None] < q_lens[:, None]  # [n, maxq]
    idx_q = (cu_q[:-1, None] + ar_q[None]).clamp(max=query.shape[2] - 1)
    idx_k = (cu_k[:-1, None] + ar_k[None]).clamp(max=key.shape[2] - 1)
    q = query[0][:, idx_q].transpose(0, 1)  # [n, H, maxq, D]
    k = key[0][:, idx_k].transpose(0, 1)  # [n, Hkv, maxk, D]
    v = value[0][:, idx_k].transpose(0, 1)
    offset = (k_lens - q_lens)[:, None, None]
    mask = (ar_k[None, None] <= offset + ar_q[None, :, None]) & (ar_k[None] < k_lens[:, None])[:, None, :]
    mask[:, :, 0] |= ~valid_q  # padded query rows see one key (their output is dropped): no NaN rows
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], scale=scaling, enable_gqa=True)
    return out.transpose(1, 2)[valid_q].unsqueeze(0)  # [1, Tq, H, D] in packed order


def varlen_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                position_bias=None, cache=None, **kwargs):
    """transformers attention function (the ``"sdpa"`` signature), per sequence for CB steps."""
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if isinstance(cu_k, dict):
        cu_k = cu_k.get(getattr(module, "layer_type", None) or "full_attention")
    few = cu_q is not None and len(cu_q) <= DENSE_UP_TO + 1
    if not isinstance(cache, PagedAttentionCache) or cu_q is None or cu_k is None or position_bias is not None or few:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, is_causal, position_bias, cache, **kwargs
        )
    key, value = cache.update(key_states=key, value_states=value, layer_idx=module.layer_idx, kwargs=kwargs)
    return padded_attention(query, key, value, cu_q, cu_k, scaling).contiguous(), None


def install(varlen: bool = True) -> None:
    """Route transformers' ``"sdpa"`` attention through ``varlen_sdpa`` in this process (or, with
    ``varlen=False``, back to the stock implementation)."""
    AttentionInterface.register("sdpa", varlen_sdpa if varlen else sdpa_attention_forward)
