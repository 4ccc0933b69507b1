"""Seeded sampling (``GenerateParams.seed``): the wire carries it (unset = None), and the SGS core gives
each sample of a seeded call a stable seed of its own (``services.generation.core.request_seed``)."""

from __future__ import annotations

import pytest

from services.common.types import GenerateParams, PromptSpec
from services.generation import convert
from services.generation.core import request_seed, sampling_of
from services.proto import braid_pb2 as pb


@pytest.mark.parametrize("seed", [None, 0, 12345, 2**64 - 1])
def test_the_seed_round_trips_through_the_wire_and_unset_is_none(seed):
    params = GenerateParams(samples_per_prompt=2, temperature=0.5, seed=seed)
    wire = convert.request_to_pb([PromptSpec("p", (1, 2))], params)
    assert wire.HasField("seed") == (seed is not None)
    assert convert.request_from_pb(pb.GenerateRequest.FromString(wire.SerializeToString()))[1] == params


@pytest.mark.parametrize("seed", [-1, 2**64])
def test_a_seed_the_wire_cannot_carry_is_refused_by_the_client(seed):
    with pytest.raises(ValueError, match=r"GenerateParams.seed .* out of range: a seed is an unsigned 64-bit"):
        convert.request_to_pb([PromptSpec("p", (1, 2))], GenerateParams(seed=seed))


def test_each_sample_gets_its_own_seed_and_the_same_one_in_every_call():
    seeds = {request_seed(12345, f"p{i}", k) for i in range(100) for k in range(3)}
    assert len(seeds) == 300 and all(0 <= s < 2**63 for s in seeds)  # 63 bits: every engine's range
    assert request_seed(12345, "p1", 0) != request_seed(12346, "p1", 0)
    assert request_seed(12345, "p1", 2) != request_seed(12345, "p1", 0)
    assert sampling_of(GenerateParams(temperature=0.7, top_k=5), "p1", 0).seed is None  # unseeded: training
    s = sampling_of(GenerateParams(temperature=0.7, top_k=5, seed=12345), "p1", 0)
    assert (s.temperature, s.top_k, s.seed) == (0.7, 5, request_seed(12345, "p1", 0))


def test_the_seed_is_a_stable_hash():
    """Not Python's salted ``hash()``: the same value in every process and on every machine (pinned
    here: a change re-draws every evaluation, so a run's ``final/`` no longer re-scores as it scored)."""
    assert request_seed(7, "prompt-3", 1) == 268214742537945575
