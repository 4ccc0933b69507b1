"""Partial rollout in the SGS: a weight update interrupts running interruptible samples."""

from __future__ import annotations

import threading
import time

import pytest

from services.common.types import GenerateParams, PromptSpec
from services.generation.client import GenerationClient
from services.policy.model import load_policy
from tests.conftest import FAST_ENGINE, start_sgs, stop_sgs


@pytest.mark.long  # `make test-long` (CI runs it; docs/testing.md)
def test_weight_update_interrupts_running_samples_and_they_resume_on_the_new_version(tmp_path, tiny_checkpoint):
    # 20 ms per engine step: the samples are still running when the update arrives
    proc = start_sgs(tmp_path, tiny_checkpoint, ["generation.max_new_tokens=200", "generation.step_delay_ms=[20]"])
    client = GenerationClient(proc.address)
    try:
        client.wait_ready()
        prompts = [PromptSpec(f"p{i}", (1, 5, 6, 7)) for i in range(2)]
        params = GenerateParams(samples_per_prompt=4, max_new_tokens=200, interruptible=True)
        samples = []
        reader = threading.Thread(target=lambda: samples.extend(client.generate(prompts, params)))
        reader.start()
        time.sleep(1.0)
        weights = load_policy(tiny_checkpoint).model.state_dict()
        assert client.update_weights(weights, version=1, chunk_bytes=1 << 16).staged
        reader.join(timeout=120)
        assert len(samples) == 8
        interrupted = [s for s in samples if s.finish_reason == "interrupted"]
        assert interrupted, [(s.finish_reason, len(s.token_ids)) for s in samples]
        for s in interrupted:
            assert s.weight_version == 0 and len(s.token_ids) == len(s.logprobs) < 200
        # installed at once: no drain of the interrupted samples' remaining tokens (>= 2 s at 20 ms/token)
        deadline = time.monotonic() + 1.0
        while client.health().weight_version != 1:
            assert time.monotonic() < deadline, client.health()
            time.sleep(0.05)
        s = interrupted[0]
        resumed = PromptSpec("resume", tuple(s.prompt_token_ids) + tuple(s.token_ids))
        left = 200 - len(s.token_ids)
        (rest,) = client.generate([resumed], GenerateParams(max_new_tokens=left, min_weight_version=1))
        assert rest.weight_version == 1 and 1 <= len(rest.token_ids) <= left
    finally:
        client.close()
        assert stop_sgs(proc) == 0, proc.log.read_text()[-3000:]


def test_interrupt_by_tag_returns_running_and_queued_samples_and_spares_other_calls(tmp_path, tiny_checkpoint):
    """Migration's Interrupt command: the tagged call's samples come back at once (running ones with
    their tokens so far, queued ones empty); another call runs on; bad requests get a clear status."""
    import grpc

    # the fast engine: interrupt by tag is the SGS's (the engine contract checks each engine's interrupt)
    proc = start_sgs(tmp_path, tiny_checkpoint, [FAST_ENGINE, "generation.max_new_tokens=200",
                                                 "generation.step_delay_ms=[20]", "generation.max_inflight=4"])
    client = GenerationClient(proc.address)
    try:
        client.wait_ready()
        moved, other = [], []
        a = threading.Thread(target=lambda: moved.extend(client.generate(
            [PromptSpec("a", (1, 5, 6, 7))], GenerateParams(samples_per_prompt=6, max_new_tokens=200, tag="mig-a"))))
        a.start()
        deadline = time.monotonic() + 60
        while client.health().running < 4:  # 4 running (max_inflight), 2 queued
            assert time.monotonic() < deadline, client.health()
            time.sleep(0.02)
        b = threading.Thread(target=lambda: other.extend(client.generate(
            [PromptSpec("b", (1, 5, 6))], GenerateParams(samples_per_prompt=1, max_new_tokens=5, tag="stay"))))
        b.start()
        assert client.interrupt(["mig-a", "no-such-tag"]) == 6
        a.join(timeout=60)
        b.join(timeout=120)
        assert sorted(s.finish_reason for s in moved) == ["interrupted"] * 6
        assert sum(1 for s in moved if s.weight_version == 0) == 4  # the running ones, tokens so far
        for s in moved:
            assert len(s.token_ids) == len(s.logprobs) < 200
            if s.weight_version == -1:  # queued: never started
                assert s.token_ids == ()
        assert len(other) == 1 and other[0].finish_reason in ("stop", "length")
        assert client.interrupt(["mig-a"]) == 0  # nothing left of that call
        for tags, match in (([], "request_tags"), (["x" * 300], "request_tags")):
            with pytest.raises(grpc.RpcError) as err:
                client.interrupt(tags)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and match in err.value.details()
        assert client.health().status == "serving"
    finally:
        client.close()
        assert stop_sgs(proc) == 0, proc.log.read_text()[-3000:]
