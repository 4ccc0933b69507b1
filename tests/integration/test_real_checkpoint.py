"""Real checkpoints: Braid runs on a local Hugging Face checkpoint directory, not only the built tiny model.

The test writes real-architecture checkpoints (``Qwen2ForCausalLM`` and ``LlamaForCausalLM`` with random
weights, head size 32 for vLLM's CPU attention) with a byte-level BPE tokenizer trained here on task text,
Qwen-style (no BOS, pad != EOS, tied embeddings) and Llama-3-style (BOS, no pad, two EOS ids, untied
``lm_head``), each with a chat template. Only public ``tokenizers``/``transformers`` APIs are used.

Checked: the policy loads the directory's own tokenizer (BPE merges kept, not rebuilt by ``AutoTokenizer``),
its BOS/EOS/pad conventions, the ``model.chat_template`` option, one vLLM generate round trip on the Llama
checkpoint, and a whole ``braid run --model DIR`` (warm start, SGS, trainer, 2 iterations) on the Qwen2 one.
"""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "deploy/configs/smoke.yaml")

# arch -> special tokens, BOS, EOS, pad, extra EOS ids in config.json, tied embeddings, chat template (in
# tokenizer_config.json as on most hub checkpoints, or in chat_template.jinja as transformers 5 saves it)
STYLES = {
    "qwen2": dict(
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        bos=None, eos="<|im_end|>", pad="<|endoftext|>", extra_eos=[], tie=True, jinja=False,
        template="{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
        prefix="<|im_start|>user\n",
    ),
    "llama": dict(
        specials=["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"],
        bos="<|begin_of_text|>", eos="<|eot_id|>", pad=None, extra_eos=["<|end_of_text|>"], tie=False, jinja=True,
        template="{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
        "{{ m['content'] }}<|eot_id|>{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}",
        prefix="<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n",
    ),
}


def task_text(n: int, seed: int = 99) -> list[str]:
    from services.tasks.arith import ProblemSampler, demonstration

    return [p.prompt + demonstration(p) for p in ProblemSampler(seed, max_steps=20).batch(n)]


def write_checkpoint(out: Path, arch: str) -> Path:
    """A Hugging Face checkpoint of ``arch`` with random weights and a BPE tokenizer trained on task text."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    style = STYLES[arch]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=style["specials"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(task_text(2000), trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token=style["bos"], eos_token=style["eos"], pad_token=style["pad"],
        chat_template=style["template"], clean_up_tokenization_spaces=False,
    )
    tok.save_pretrained(out, save_jinja_files=style["jinja"])
    eos_ids = [tok.eos_token_id] + [tok.convert_tokens_to_ids(t) for t in style["extra_eos"]]
    common = dict(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=512, bos_token_id=tok.bos_token_id,
        eos_token_id=eos_ids if len(eos_ids) > 1 else eos_ids[0], pad_token_id=tok.pad_token_id,
        tie_word_embeddings=style["tie"],
    )
    config, cls = (Qwen2Config, Qwen2ForCausalLM) if arch == "qwen2" else (LlamaConfig, LlamaForCausalLM)
    torch.manual_seed(0)
    cls(config(**common)).save_pretrained(out)  # safetensors
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    return {arch: write_checkpoint(tmp_path_factory.mktemp(arch) / "ckpt", arch) for arch in STYLES}


@pytest.mark.parametrize("arch", list(STYLES))
def test_policy_uses_the_checkpoints_own_tokenizer_and_special_tokens(checkpoints, arch):
    from tokenizers import Tokenizer

    from services.generation.checkpoint import inspect_checkpoint
    from services.policy.model import load_policy
    from services.tasks.arith import ProblemSampler, demonstration

    path, style = checkpoints[arch], STYLES[arch]
    files = {p.name for p in path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= files
    assert ("chat_template.jinja" in files) == style["jinja"]
    info = inspect_checkpoint(path)
    policy = load_policy(path)
    raw = Tokenizer.from_file(str(path / "tokenizer.json"))
    assert len(policy.tokenizer) == raw.get_vocab_size() == info.vocab_size == policy.model.config.vocab_size
    problem = ProblemSampler(7).sample()
    ids = policy.encode_prompt(problem.prompt)
    body = ids[1:] if style["bos"] else ids
    assert body == raw.encode(problem.prompt, add_special_tokens=False).ids  # tokenizer.json as written
    assert len(body) < len(problem.prompt)  # BPE merges, not one token per character
    assert all(0 <= i < info.vocab_size for i in ids)
    assert policy.decode([*policy.tokenizer.encode(demonstration(problem), add_special_tokens=False), policy.eos_id]) \
        == demonstration(problem)
    assert policy.eos_id == policy.tokenizer.convert_tokens_to_ids(style["eos"]) and policy.eos_id in info.eos_ids
    if style["bos"]:  # Llama: BOS first, no pad token (pad = EOS), two EOS ids
        assert ids[0] == policy.tokenizer.convert_tokens_to_ids(style["bos"])
        assert policy.pad_id == policy.eos_id and len(info.eos_ids) == 2
    else:  # Qwen2: no BOS, a pad token of its own
        assert policy.tokenizer.bos_token_id is None and policy.pad_id != policy.eos_id


@pytest.mark.parametrize("arch", list(STYLES))
def test_chat_template_wraps_the_prompt_as_a_user_message(checkpoints, arch):
    from services.common.config import ConfigError, load_config
    from services.policy.model import load_policy

    style = STYLES[arch]
    plain, templated = load_policy(checkpoints[arch]), load_policy(checkpoints[arch], chat_template=True)
    prompt = "702-3>700="
    ids = templated.encode_prompt(prompt)
    prefix = templated.tokenizer.encode(style["prefix"], add_special_tokens=False)
    assert ids[: len(prefix)] == prefix and len(ids) > len(plain.encode_prompt(prompt))
    text = templated.tokenizer.decode(ids)
    assert text == templated.tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("assistant\n" if arch == "qwen2" else "assistant<|end_header_id|>\n\n")
    # a dataset's system prompt: the template's system turn, or the plain text before the prompt
    system = "Answer with a number."
    assert (templated.tokenizer.decode(templated.encode_prompt(prompt, system))
            == templated.tokenizer.apply_chat_template(
                [{"role": "system", "content": system}, {"role": "user", "content": prompt}],
                add_generation_prompt=True, tokenize=False))
    assert (plain.tokenizer.decode(plain.encode_prompt(prompt, system), skip_special_tokens=True)
            == f"{system}\n\n{prompt}")
    with pytest.raises(ConfigError, match=r"chat_template needs model.path"):
        load_config(SMOKE, ["model.chat_template=true"])


def test_eos_comes_from_config_json_and_must_agree_with_it(checkpoints, tmp_path):
    import shutil

    from services.policy.model import load_policy

    def variant(name: str, file: str, edit) -> Path:
        path = Path(shutil.copytree(checkpoints["qwen2"], tmp_path / name))
        data = json.loads((path / file).read_text())
        edit(data)
        (path / file).write_text(json.dumps(data))
        return path

    eos = json.loads((checkpoints["qwen2"] / "config.json").read_text())["eos_token_id"]
    no_eos = variant("no-eos", "tokenizer_config.json", lambda d: d.update(eos_token=None))
    assert load_policy(no_eos).eos_id == eos  # a tokenizer without EOS takes config.json's
    other = variant("other-eos", "config.json", lambda d: d.update(eos_token_id=[eos + 1]))
    with pytest.raises(ValueError, match=r"not among config.json's eos_token_id"):
        load_policy(other)


def run(engine, n: int, timeout_s: float = 120.0) -> list:
    outs, deadline = [], time.monotonic() + timeout_s
    while len(outs) < n:
        assert time.monotonic() < deadline, f"engine gave {len(outs)} of {n} outputs in {timeout_s} s"
        outs += engine.poll(0.05)
    return outs


def test_vllm_generates_from_the_llama_checkpoint(checkpoints):
    from services.common.config import GenerationConfig
    from services.generation.engine import create_engine
    from services.policy.model import load_policy
    from services.tasks.arith import ProblemSampler

    path = checkpoints["llama"]
    policy = load_policy(path)
    vocab = len(policy.tokenizer)
    # vLLM starts only if its KV cache holds max_position_embeddings (512) tokens plus a block: 32 x 32
    cfg = GenerationConfig(engine="vllm", num_blocks=32, page_size=32, max_inflight=8)
    engine = create_engine("vllm", str(path), cfg)
    try:
        prompts = {p.prompt_id: policy.encode_prompt(p.prompt) for p in ProblemSampler(3).batch(3)}
        for rid, ids in prompts.items():
            engine.submit(rid, ids, 12)
        outs = run(engine, len(prompts))
        assert sorted(o.request_id for o in outs) == sorted(prompts)
        for o in outs:
            assert 0 < len(o.token_ids) <= 12 and len(o.logprobs) == len(o.token_ids)
            assert all(0 <= t < vocab for t in o.token_ids)
            assert isinstance(policy.decode(o.token_ids), str)
        # a weight update reaches the untied lm_head: zero logits -> the uniform distribution over the vocabulary
        state = {k: (v.clone().zero_() if k == "lm_head.weight" else v) for k, v in policy.model.state_dict().items()}
        assert set(state) == set(engine.param_specs())
        engine.load_weights(state)
        engine.submit("after", prompts["p0"], 4)
        (after,) = run(engine, 1)
        assert after.logprobs == pytest.approx([-math.log(vocab)] * len(after.token_ids), abs=1e-4)
    finally:
        engine.close()


@pytest.mark.long  # `make test-long` (CI runs it; docs/testing.md)
def test_braid_run_on_a_qwen2_checkpoint(prefect_api, checkpoints, tmp_path, monkeypatch, capsys):
    """``braid run --model DIR``: warm start, SGS and trainer all on the checkpoint, with its chat template."""
    from flows.cli import main
    from services.policy.model import load_policy

    defaults = {"PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "INFO"}
    for var, value in defaults.items():  # what braid run sets (setdefault) is undone after this test
        monkeypatch.setenv(var, os.environ.get(var, value))
    ckpt, genlog = checkpoints["qwen2"], tmp_path / "genlog.sqlite"
    overrides = [
        f"runs_dir={tmp_path / 'runs'}", f"cache_dir={tmp_path / 'cache'}", "model.chat_template=true",
        "warmstart.steps=3", "warmstart.batch_size=8", "eval.prompts=4", "generation.max_new_tokens=16",
        "trainer.prompts_per_iteration=2", "trainer.group_size=2", "trainer.micro_batch_groups=1",
        "trainer.kl_coef=0.01",  # every group is trained, even when all its rewards are equal
        f"generation.genlog={genlog}",
    ]
    argv = ["run", "--config", SMOKE, "--model", str(ckpt), "--run-id", "real"]
    assert main(argv + [x for o in overrides for x in ("--set", o)]) == 0
    run_dir = tmp_path / "runs" / "real"
    assert f'"run_dir": "{run_dir}"' in capsys.readouterr().out
    config = json.loads((run_dir / "config.json").read_text())
    assert config["model"]["path"] == str(ckpt) and config["model"]["chat_template"] is True

    # warm start: trained from the checkpoint, saved with the checkpoint's architecture and tokenizer
    warm = Path((run_dir / "warmstart.path").read_text().strip())
    assert json.loads((warm / "warmstart.json").read_text())["steps"] == 3
    warm_config = json.loads((warm / "config.json").read_text())
    original, warmed = load_policy(ckpt, chat_template=True), load_policy(warm, chat_template=True)
    assert warm_config["architectures"] == ["Qwen2ForCausalLM"] and warm_config["vocab_size"] == len(original.tokenizer)
    for text in task_text(50, seed=5):  # the trainer encodes prompts as the checkpoint's tokenizer does, BPE merges
        assert warmed.encode_prompt(text) == original.encode_prompt(text)
        assert len(warmed.tokenizer.encode(text, add_special_tokens=False)) < len(text)

    # trainer: 2 optimizer steps on SGS samples
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1] and [r["weight_version"] for r in rows] == [1, 2]
    assert all(r["samples"] == 4 and r["trained_samples"] == 4 for r in rows)
    assert all(0 < r["response_len_mean"] <= 16 for r in rows)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["iterations"] == 2 and summary["eval_prompts"] == 4

    # the SGS served the trainer's token ids: every prompt it logged is a task prompt in the checkpoint's template
    with sqlite3.connect(genlog) as db:
        logged = db.execute("SELECT prompt, response_length FROM generations").fetchall()
    assert len(logged) == 2 * 4 + 2 * 4  # 2 iterations x 2 prompts x 2 samples, eval before and after
    for prompt, length in logged:
        assert re.fullmatch(r"user\n\d+-\d>\d+=\nassistant\n", prompt), prompt  # special tokens skipped
        assert 0 < length <= 16

