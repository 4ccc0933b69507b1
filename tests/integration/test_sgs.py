"""The Stream Generation Service as a real process on a loopback port."""

from __future__ import annotations

import math
import time
from dataclasses import replace

import grpc
import pytest
import torch

from services.common.types import GenerateParams, PromptSpec
from services.common.weights import iter_chunks
from services.generation import convert
from services.policy.model import load_policy


def prompts(n: int, tokens=(1, 5, 6, 7)) -> list[PromptSpec]:
    return [PromptSpec(f"p{i}", tuple(tokens)) for i in range(n)]


def test_samples_stream_in_completion_order_before_the_slowest_finishes(sgs):
    _, client = sgs
    arrivals = []
    for sample in client.generate(prompts(4), GenerateParams(samples_per_prompt=4, max_new_tokens=200)):
        arrivals.append((time.time(), sample))
    assert len(arrivals) == 16
    finished = [s.finished_at for _, s in arrivals]
    assert finished == sorted(finished)  # completion order, not request order
    lengths = [len(s.token_ids) for _, s in arrivals]
    assert lengths[0] < max(lengths)
    assert arrivals[0][0] < max(finished)  # the first sample was in hand while another still ran
    for _, s in arrivals:
        assert len(s.logprobs) == len(s.token_ids) and all(lp <= 0 for lp in s.logprobs)
        assert s.weight_version == 0 and s.finish_reason in ("stop", "length")
        assert s.submitted_at <= s.started_at <= s.finished_at


def _weights_with(checkpoint, fn) -> dict[str, torch.Tensor]:
    state = load_policy(checkpoint).model.state_dict()
    return {k: fn(k, v.clone()) for k, v in state.items()}


def test_weight_update_changes_generation_and_reported_version(sgs, tiny_checkpoint):
    _, client = sgs
    before = list(client.generate(prompts(2), GenerateParams(samples_per_prompt=2, max_new_tokens=8)))
    assert all(s.weight_version == 0 for s in before)
    uniform = _weights_with(tiny_checkpoint, lambda k, v: torch.zeros_like(v))  # zero net -> uniform next-token dist
    ack = client.update_weights(uniform, version=1, chunk_bytes=4096)
    assert ack.staged and ack.version == 1
    after = list(client.generate(prompts(2),
                                 GenerateParams(samples_per_prompt=2, max_new_tokens=8, min_weight_version=1)))
    vocab = len(load_policy(tiny_checkpoint).tokenizer)
    assert all(s.weight_version == 1 for s in after)
    assert all(lp == pytest.approx(-math.log(vocab), abs=1e-4) for s in after for lp in s.logprobs)
    assert not all(lp == pytest.approx(-math.log(vocab), abs=1e-4) for s in before for lp in s.logprobs)
    assert client.health().weight_version == 1


def _expect(code, match, fn):
    with pytest.raises(grpc.RpcError) as err:
        fn()
    assert err.value.code() == code, err.value.details()
    assert match in err.value.details()


@pytest.mark.parametrize(
    "ps, params, match",
    [
        ([], GenerateParams(), "no prompts"),
        (prompts(1, tokens=(1, 999)), GenerateParams(), "outside [0,"),
        (prompts(1, tokens=()), GenerateParams(), "has no tokens"),
        (prompts(2) + prompts(1), GenerateParams(), "duplicate prompt_id"),
        (prompts(1), GenerateParams(samples_per_prompt=0), "samples_per_prompt"),
        (prompts(1), GenerateParams(max_new_tokens=10_000), "exceeds the service limit"),
        (prompts(1), GenerateParams(min_weight_version=-1), "min_weight_version"),
        ([PromptSpec("p0", (1, 5), forced_lengths=(3, 4))], GenerateParams(samples_per_prompt=2), "does not accept"),
        (prompts(40), GenerateParams(samples_per_prompt=1024), "sequences; the limit"),
        (prompts(1), GenerateParams(temperature=-1.0), "sampling out of range"),
        (prompts(1), GenerateParams(top_p=1.5), "sampling out of range"),
        (prompts(1), GenerateParams(top_k=100_000), "sampling out of range"),
    ],
)
def test_malformed_generate_requests_are_refused(sgs, ps, params, match):
    _, client = sgs
    _expect(grpc.StatusCode.INVALID_ARGUMENT, match, lambda: list(client.generate(ps, params)))


def test_oversized_request_is_refused_and_service_keeps_serving(sgs):
    _, client = sgs
    huge = [PromptSpec("big", tuple([5] * 1_500_000))]  # ~1.5 MB on the wire; the limit is 1 MiB
    _expect(grpc.StatusCode.RESOURCE_EXHAUSTED, "", lambda: list(client.generate(huge, GenerateParams())))
    assert len(list(client.generate(prompts(1), GenerateParams(max_new_tokens=4)))) == 1


def _push(client, chunks):
    return client._stub.UpdateWeights((convert.chunk_to_pb(c) for c in chunks), timeout=60)


@pytest.mark.parametrize(
    "edit, code, match",
    [
        (lambda k, v: v, grpc.StatusCode.FAILED_PRECONDITION, "not newer than the installed"),
        ("rename", grpc.StatusCode.INVALID_ARGUMENT, "unknown parameter"),
        (lambda k, v: v.reshape(-1) if v.dim() == 2 else v, grpc.StatusCode.INVALID_ARGUMENT,
         "expected dtype float32 shape"),
        (lambda k, v: v.half(), grpc.StatusCode.INVALID_ARGUMENT, "got dtype float16"),
        ("corrupt", grpc.StatusCode.DATA_LOSS, "digest mismatch"),
    ],
)
def test_bad_weights_are_refused_and_service_keeps_serving(sgs, tiny_checkpoint, edit, code, match):
    _, client = sgs
    installed = client.health().weight_version
    state = _weights_with(tiny_checkpoint, lambda k, v: v)
    if callable(edit):
        state = {k: edit(k, v) for k, v in state.items()}
    version = installed if callable(edit) and match.startswith("not newer") else installed + 1
    chunks = list(iter_chunks(state, version, chunk_bytes=4096))
    if edit == "rename":
        chunks[0] = type(chunks[0])(**{**chunks[0].__dict__, "name": "model.not_a_layer"})
    if edit == "corrupt":
        chunks[1] = type(chunks[1])(**{**chunks[1].__dict__, "data": bytes(len(chunks[1].data))})
    _expect(code, match, lambda: _push(client, chunks))
    health = client.health()
    assert health.status == "serving" and health.weight_version == installed
    assert len(list(client.generate(prompts(1), GenerateParams(max_new_tokens=4)))) == 1


def test_an_adapter_pushed_to_a_full_weights_sgs_is_refused(sgs, tiny_checkpoint):
    """Without trainer.lora the SGS takes full weights only: a LoRA adapter is refused, saying so."""
    from services.common.lora import LoraConfig, adapter_specs

    _, client = sgs
    installed = client.health().weight_version
    adapter = {k: torch.zeros(s.shape) for k, s in adapter_specs(tiny_checkpoint, LoraConfig(rank=4)).items()}
    _expect(grpc.StatusCode.INVALID_ARGUMENT, "this SGS serves full weights",
            lambda: client.update_weights(adapter, installed + 1, chunk_bytes=4096))
    assert client.health().weight_version == installed


def test_health_reports_counts_and_version(sgs):
    _, client = sgs
    h = client.health()
    assert h.engine == "vllm" and h.running == 0 and h.waiting == 0 and h.finished > 0 and 0.0 <= h.kv_usage <= 1.0


def test_per_request_temperature_reaches_the_engine(sgs):
    """A near-zero temperature samples greedily: every sample of a prompt is the same."""
    _, client = sgs
    greedy = [s.token_ids for s in client.generate(prompts(1), GenerateParams(samples_per_prompt=6, max_new_tokens=24,
                                                                               temperature=1e-6))]
    hot = [s.token_ids for s in client.generate(prompts(1), GenerateParams(samples_per_prompt=6, max_new_tokens=24,
                                                                            temperature=2.0))]
    assert len(set(greedy)) == 1 and len(set(hot)) > 1


def test_a_seeded_call_reproduces_each_sample_whatever_else_the_service_runs(sgs):
    """``GenerateParams.seed`` (evaluations): each sample's seed comes from the call's seed and its
    prompt id and index, so a call repeated in another order, beside other prompts and after
    unseeded work gives the same samples; prompts of the same tokens still get samples of their own."""
    _, client = sgs
    params = GenerateParams(samples_per_prompt=2, max_new_tokens=16, temperature=1.0, seed=12345)
    same = prompts(3)  # the same tokens under three prompt ids
    first = {(s.prompt_id, s.sample_index): (s.token_ids, s.logprobs) for s in client.generate(same, params)}
    list(client.generate(prompts(2), GenerateParams(samples_per_prompt=2, max_new_tokens=8, temperature=1.0)))
    again = {(s.prompt_id, s.sample_index): (s.token_ids, s.logprobs)
             for s in client.generate([PromptSpec("x", (1, 9, 4)), *same[::-1]], params)}
    assert {k: again[k] for k in first} == first
    assert len({tokens for tokens, _ in first.values()}) == 6
    other = {(s.prompt_id, s.sample_index): s.token_ids for s in client.generate(same, replace(params, seed=1))}
    assert all(other[k] != tokens for k, (tokens, _) in first.items())
