"""The Hugging Face <-> megatron-core conversion, numerically (CPU, under the test shims).

Two tiny models cover the layouts: Qwen2 (q/k/v biases, grouped-query 4 heads / 2 kv heads, tied
embeddings) and Llama (no biases, grouped-query, untied ``lm_head``). Checked: the round trip is
bit-exact; Megatron's own qkv split of the fused tensor gives Hugging Face's q/k/v projections;
the Hugging Face model and its Megatron twin give the same logits on a right-padded batch; after
an AdamW step through the learner, the weights converted back give a fresh Hugging Face model the
Megatron model's logits; unsupported settings are refused with a clear error.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from services.common.config import ModelConfig, RunConfig
from services.policy.batch import pack
from services.policy.model import Policy, build_policy, char_tokenizer
from tests.megatron_shims import megatron_clean, megatron_cpu, megatron_or_skip  # noqa: F401 (fixtures)
from tests.unit.test_learner import _groups

megatron_or_skip()

from services.trainer.megatron.bridge import fuse_qkv, geometry, qkv_part, to_hf, to_megatron  # noqa: E402

SHAPE = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=96)
TOL = 1e-5  # float32, logits of magnitude ~1: the same math in another association order (measured ~2e-7)


def qwen2() -> Policy:
    """Qwen2: q/k/v biases, 4 heads over 2 kv heads, tied embeddings."""
    return build_policy(ModelConfig(arch="qwen2", init_seed=1, **SHAPE))


def llama_untied() -> Policy:
    """Llama: no biases, 4 heads over 2 kv heads, its own lm_head."""
    tok = char_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, rope_theta=5e5, rms_norm_eps=1e-5,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(2)
    return Policy(model=AutoModelForCausalLM.from_config(config, dtype=torch.float32), tokenizer=tok)


POLICIES = {"qwen2": qwen2, "llama": llama_untied}


def _cfg(**trainer) -> RunConfig:
    return RunConfig.model_validate({"model": SHAPE, "trainer": {"backend": "megatron", "lr": 1e-2, **trainer}})


def _backend(policy: Policy, **trainer):
    from services.trainer.backends import create_backend

    return create_backend(_cfg(**trainer), policy)


def _batch(pad_id: int):
    """Right-padded rows of different lengths (pad positions are compared nowhere)."""
    return pack([[1, 5, 6], [1, 7], [1, 9, 10, 4]], [[8, 9, 10, 11, 3], [12], [6, 6]], pad_id)


def _max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return float((a - b)[mask.bool()].abs().max())


@pytest.mark.parametrize("arch", POLICIES)
def test_the_round_trip_is_bit_exact(arch):
    model = POLICIES[arch]().model
    g, state = geometry(model.config), model.state_dict()
    assert g.tied == (arch == "qwen2") and g.qkv_bias == (arch == "qwen2") and g.kv_heads == 2
    megatron = dict(to_megatron(state, g))
    assert ("output_layer.weight" in megatron) == (arch == "llama")
    back = list(to_hf(megatron, g, state))
    assert [name for name, _ in back] == list(state)  # the Hugging Face order, lm_head included when tied
    for name, value in back:
        assert torch.equal(value, state[name]), name


def test_qkv_fusion_interleaves_query_groups():
    g = geometry(qwen2().model.config)  # 4 heads, 2 groups, head_dim 16
    q, k, v = (torch.arange(n * 16.0).view(n * 16, 1) + base for n, base in ((4, 0), (2, 1000), (2, 2000)))
    fused = fuse_qkv(q, k, v, g)
    rows = [int(r) for r in fused[::16, 0]]  # the first row of each head block
    assert rows == [0, 16, 1000, 2000, 32, 48, 1016, 2016]  # group 0: q0 q1 k0 v0; group 1: q2 q3 k1 v1
    for part, want in zip("qkv", (q, k, v), strict=True):
        assert torch.equal(qkv_part(fused, part, g), want)


@pytest.mark.parametrize("arch", POLICIES)
@pytest.mark.usefixtures("megatron_cpu")
def test_megatron_splits_its_fused_qkv_into_the_hf_projections(arch):
    policy = POLICIES[arch]()
    backend = _backend(policy)
    x = torch.randn(5, 3, 64, generator=torch.Generator().manual_seed(0))  # [T, B, hidden], Megatron's order
    attention = backend.module.gpt.decoder.layers[1].self_attention
    hf = policy.model.model.layers[1].self_attn
    with torch.no_grad():
        q, k, v = attention.get_query_key_value_tensors(x, None)
        for got, proj, heads in ((q, hf.q_proj, 4), (k, hf.k_proj, 2), (v, hf.v_proj, 2)):
            assert torch.allclose(got, proj(x).view(5, 3, heads, 16), atol=1e-6)


@pytest.mark.parametrize("arch", POLICIES)
@pytest.mark.usefixtures("megatron_cpu")
def test_the_megatron_twin_gives_the_hf_logits(arch):
    policy = POLICIES[arch]()
    backend = _backend(policy)
    assert backend.weights().host_copies().keys() == policy.model.state_dict().keys()
    for name, value in backend.weights().host_copies().items():
        assert torch.equal(value, policy.model.state_dict()[name]), name
    batch = _batch(policy.pad_id)
    with torch.no_grad():
        want = policy.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        got = backend.module(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    assert got.shape == want.shape == (3, batch.input_ids.shape[1], len(policy.tokenizer))
    diff = _max_diff(got, want, batch.attention_mask)
    assert diff < TOL, f"{arch}: max |logit diff| {diff:.3g} at non-pad positions"


@pytest.mark.parametrize("arch", POLICIES)
@pytest.mark.usefixtures("megatron_cpu")
def test_trained_megatron_weights_load_back_into_hf_with_the_same_logits(arch):
    from services.trainer.learner import Learner

    policy = POLICIES[arch]()
    start = {k: v.clone() for k, v in policy.model.state_dict().items()}
    learner = Learner(_cfg(), policy)
    learner.begin()
    learner.backward(_groups())
    learner.step()
    trained = learner.weights().host_copies()
    assert all(v.dtype == torch.float32 for v in trained.values())
    assert sum(not torch.equal(trained[k], start[k]) for k in start) >= len(start) - 1  # AdamW moved (almost) all
    fresh = AutoModelForCausalLM.from_config(policy.model.config, dtype=torch.float32).eval()
    fresh.load_state_dict(trained, strict=True)
    if arch == "qwen2":  # tied: lm_head is the trained embedding, not a stale copy
        assert torch.equal(fresh.lm_head.weight, trained["model.embed_tokens.weight"])
    batch = _batch(policy.pad_id)
    with torch.no_grad():
        want = learner.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        got = fresh(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    assert _max_diff(got, want, batch.attention_mask) < TOL


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU error on a machine without CUDA")
@pytest.mark.usefixtures("megatron_clean")
def test_cpu_without_the_test_shims_is_a_clear_error():
    from services.trainer.megatron import MegatronDeviceError

    with pytest.raises(MegatronDeviceError, match=r"needs CUDA.*only\s+under the test shims"):
        _backend(qwen2())


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU refusal")
@pytest.mark.usefixtures("megatron_cpu")
def test_bfloat16_on_cpu_is_refused():
    with pytest.raises(ValueError, match=r"bfloat16 with trainer.backend megatron needs CUDA"):
        _backend(qwen2(), dtype="bfloat16")


@pytest.mark.usefixtures("megatron_cpu")
def test_activation_checkpointing_recomputes_each_layer_with_the_same_gradients():
    from services.trainer.learner import Learner
    from services.trainer.megatron.bridge import recomputed_layer_class

    def step(**trainer) -> tuple[Learner, dict[str, torch.Tensor]]:
        learner = Learner(_cfg(**trainer), qwen2())
        learner.begin()
        learner.backward(_groups())
        return learner, {k: p.grad.clone() for k, p in learner.model.named_parameters()}

    recomputed, got = step(activation_checkpointing=True)
    assert all(type(layer) is recomputed_layer_class() for layer in recomputed.model.gpt.decoder.layers)
    _, want = step()
    assert got.keys() == want.keys()  # the same parameter names: the bridge's table still applies
    for k in want:
        assert torch.allclose(got[k], want[k], atol=1e-7, rtol=1e-5), k


def test_unconverted_architectures_are_refused():
    config = qwen2().model.config
    config.hidden_act = "gelu"
    with pytest.raises(ValueError, match="hidden_act 'gelu'"):
        geometry(config)
    config.hidden_act, config.model_type = "silu", "mistral"
    with pytest.raises(ValueError, match="converts \\['qwen2', 'llama'\\] models, not 'mistral'"):
        geometry(config)
