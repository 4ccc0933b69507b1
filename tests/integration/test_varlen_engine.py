"""The cb engine gives the same samples with per-sequence (varlen) attention as with transformers'
dense masked SDPA: same seed, same tokens, log-probs equal within float rounding."""

from __future__ import annotations

import pytest

from services.common.config import GenerationConfig
from services.generation import varlen_attention
from services.generation.cb_engine import ContinuousBatchingEngine


def generate(checkpoint, attention: str) -> dict:
    # a small step budget: prompts are prefilled in chunks next to running decodes (mixed steps)
    cfg = GenerationConfig(attention=attention, max_new_tokens=40, max_batch_tokens=32, num_blocks=64, seed=3)
    engine = ContinuousBatchingEngine(str(checkpoint), cfg)
    try:
        for i in range(12):
            engine.submit(f"r{i}", [1] + [(i * 5 + k) % 9 + 3 for k in range(4 + i % 5)], 12 + 2 * i, ignore_eos=True)
        outs = []
        while len(outs) < 12:
            outs += engine.poll(0.01)
        return {o.request_id: o for o in outs}
    finally:
        engine.close()


def test_varlen_and_dense_attention_sample_the_same_tokens(tiny_checkpoint, monkeypatch):
    monkeypatch.setattr(varlen_attention, "DENSE_UP_TO", 0)  # every step through the per-sequence path
    dense, varlen = generate(tiny_checkpoint, "dense"), generate(tiny_checkpoint, "varlen")
    for rid, d in dense.items():
        v = varlen[rid]
        assert v.token_ids == d.token_ids and len(d.token_ids) == 12 + 2 * int(rid[1:])
        assert v.logprobs == pytest.approx(d.logprobs, abs=1e-4)
