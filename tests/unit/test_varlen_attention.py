"""Per-sequence (varlen) attention equals attention computed one sequence at a time."""

from __future__ import annotations

import math

import pytest
import torch

from services.generation.varlen_attention import padded_attention


def reference(query, key, value, q_lens, k_lens, scaling):
    """One sequence at a time, by the definition: softmax(q k^T * scale + causal) v, GQA by repetition."""
    outs, qo, ko = [], 0, 0
    rep = query.shape[1] // key.shape[1]
    for ql, kl in zip(q_lens, k_lens):
        q = query[0, :, qo:qo + ql]  # [H, ql, D]
        k = key[0, :, ko:ko + kl].repeat_interleave(rep, dim=0)
        v = value[0, :, ko:ko + kl].repeat_interleave(rep, dim=0)
        scores = q @ k.transpose(1, 2) * scaling
        allowed = torch.arange(kl)[None] <= (kl - ql) + torch.arange(ql)[:, None]
        scores = scores.masked_fill(~allowed, float("-inf"))
        outs.append((scores.softmax(-1) @ v).transpose(0, 1))  # [ql, H, D]
        qo, ko = qo + ql, ko + kl
    return torch.cat(outs).unsqueeze(0)


@pytest.mark.parametrize(
    "q_lens, k_lens",
    [
        ([1, 1, 1], [5, 17, 2]),  # decode steps
        ([6, 1, 3], [6, 30, 9]),  # a prefill (q = k), a decode, a chunked prefill after cached tokens
        ([4], [4]),
    ],
)
def test_matches_per_sequence_attention(q_lens, k_lens):
    torch.manual_seed(0)
    heads, kv_heads, dim = 4, 2, 8
    query = torch.randn(1, heads, sum(q_lens), dim)
    key, value = torch.randn(2, 1, kv_heads, sum(k_lens), dim)
    cu_q = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()])
    cu_k = torch.tensor([0, *torch.tensor(k_lens).cumsum(0).tolist()])
    scaling = 1 / math.sqrt(dim)
    got = padded_attention(query, key, value, cu_q, cu_k, scaling)
    assert got.shape == (1, sum(q_lens), heads, dim)
    torch.testing.assert_close(got, reference(query, key, value, q_lens, k_lens, scaling), atol=1e-5, rtol=1e-5)
