"""The SGS's request validation (``services.generation.server.validate_request``) on hand-made requests."""

from __future__ import annotations

import pytest

from services.common.config import load_config
from services.common.types import GenerateParams, PromptSpec
from services.generation.server import RequestError, validate_request

OK = dict(vocab_size=19, max_positions=512)


def test_a_request_larger_than_the_kv_cache_is_refused_before_it_reaches_the_engine():
    cfg = load_config(None, []).generation
    validate_request([PromptSpec("p", (1, 2, 3))], GenerateParams(max_new_tokens=64), cfg, **OK, kv_capacity=67)
    with pytest.raises(RequestError, match=r"exceed the engine's whole KV cache .66 tokens"):
        validate_request([PromptSpec("p", (1, 2, 3))], GenerateParams(max_new_tokens=64), cfg, **OK, kv_capacity=66)


@pytest.mark.parametrize("params", [dict(temperature=2.01), dict(top_p=1.01), dict(top_k=20), dict(temperature=-1.0)])
def test_sampling_outside_what_the_engines_serve_is_refused(params):
    cfg = load_config(None, []).generation
    validate_request([PromptSpec("p", (1, 2))], GenerateParams(max_new_tokens=4, temperature=2.0, top_k=19), cfg, **OK)
    with pytest.raises(RequestError, match="sampling out of range"):
        validate_request([PromptSpec("p", (1, 2))], GenerateParams(max_new_tokens=4, **params), cfg, **OK)


@pytest.mark.parametrize("seed", [-1, 2**64, -(2**63) - 1])
def test_a_seed_outside_uint64_is_refused(seed):
    cfg = load_config(None, []).generation
    for ok in (None, 0, 2**64 - 1):
        validate_request([PromptSpec("p", (1, 2))], GenerateParams(max_new_tokens=4, seed=ok), cfg, **OK)
    with pytest.raises(RequestError, match=r"sampling seed .* out of range: a seed is an unsigned 64-bit integer"):
        validate_request([PromptSpec("p", (1, 2))], GenerateParams(max_new_tokens=4, seed=seed), cfg, **OK)
