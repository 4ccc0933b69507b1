"""The policy: a causal LM built from a config (tiny, CPU) or loaded from a local checkpoint.

Both paths yield a ``Policy`` (model + tokenizer + the ids the pipeline needs), so a user with
a real HF checkpoint and a GPU runs exactly the code the tiny CPU default runs. Nothing is ever
downloaded: ``from_pretrained`` is called on local directories only, with hub access off.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from services.common.config import ModelConfig
from services.tasks.arith import ALPHABET

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]


@dataclass
class Policy:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerFast
    chat_template: bool = False  # wrap prompts as a user message in the tokenizer's chat template

    @property
    def eos_id(self) -> int:
        eos = self.tokenizer.eos_token_id
        if eos is None:
            raise ValueError("tokenizer has no eos token; the pipeline needs one to end samples")
        return int(eos)

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return self.eos_id if pad is None else int(pad)

    def encode_prompt(self, text: str, system: str | None = None) -> list[int]:
        """The prompt's token ids: with ``chat_template``, ``text`` as the user message (after a system
        message when ``system`` is given) and the assistant turn opened; otherwise the text itself,
        after ``system`` and a blank line, behind the tokenizer's BOS."""
        if self.chat_template:  # the template places any BOS itself
            if not self.tokenizer.chat_template:
                raise ValueError("model.chat_template is on but the checkpoint's tokenizer has no chat template")
            messages = ([{"role": "system", "content": system}] if system is not None else [])
            rendered = self.tokenizer.apply_chat_template(
                [*messages, {"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
            )
            return [int(i) for i in self.tokenizer.encode(rendered, add_special_tokens=False)]
        if system:
            text = f"{system}\n\n{text}"
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        bos = self.tokenizer.bos_token_id
        return ([int(bos)] if bos is not None else []) + [int(i) for i in ids]

    def decode(self, ids: list[int]) -> str:
        eos = self.eos_id  # once: the tokenizer's attribute lookup cost ~10 us a token, on the orchestrator's thread
        return self.tokenizer.decode([i for i in ids if i != eos], skip_special_tokens=True)


def char_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer over the task alphabet (one token per character)."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS + list(ALPHABET))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )


def build_policy(cfg: ModelConfig) -> Policy:
    """Build the tiny policy from ``cfg`` (random init, seeded)."""
    tok = char_tokenizer()
    common = dict(
        vocab_size=len(tok),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_positions,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    config = Qwen2Config(**common) if cfg.arch == "qwen2" else LlamaConfig(**common)
    torch.manual_seed(cfg.init_seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return Policy(model=model, tokenizer=tok)


def load_tokenizer(path: str | Path):
    """A local checkpoint's tokenizer: its ``tokenizer.json`` as written when it has one
    (``AutoTokenizer`` would rebuild a Qwen2 tokenizer from the vocabulary with Qwen's own
    pre-tokenizer, ignoring the file's), else ``AutoTokenizer``; never the hub."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tok_cls = PreTrainedTokenizerFast if (Path(path) / "tokenizer.json").is_file() else AutoTokenizer
    return tok_cls.from_pretrained(path, local_files_only=True)


def load_policy(path: str | Path, chat_template: bool = False) -> Policy:
    """Load a policy from a local checkpoint directory (never the hub; tokenizer: ``load_tokenizer``)."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a local HF checkpoint (no config.json)")
    tok = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    eos = model.config.eos_token_id
    eos_ids = [int(e) for e in (eos if isinstance(eos, list) else [] if eos is None else [eos])]
    if tok.eos_token_id is None and eos_ids:  # samples end on the config's EOS; train toward the same
        tok.eos_token = tok.convert_ids_to_tokens(eos_ids[0])
    if eos_ids and tok.eos_token_id not in eos_ids:
        raise ValueError(
            f"{path}: the tokenizer's eos token id {tok.eos_token_id} is not among config.json's eos_token_id "
            f"{eos_ids}: generation stops only on the latter, so samples would never end"
        )
    return Policy(model=model, tokenizer=tok, chat_template=chat_template)


def load_checkpoint(path: str | Path, base: str | Path | None = None, chat_template: bool = False) -> Policy:
    """A saved checkpoint's policy: a Hugging Face checkpoint as ``load_policy`` loads it, or a LoRA
    adapter directory (a ``trainer.lora`` run's checkpoint) folded into its base: ``base``, else the
    base the adapter names; ``AdapterError`` when that base is not here or the adapter does not fit it."""
    from services.common.lora import ADAPTER_CONFIG, AdapterError, adapter_base, check_fits, merge_into

    if not (Path(path) / ADAPTER_CONFIG).is_file():
        return load_policy(path, chat_template)
    base = base or adapter_base(path)
    if base is None or not (Path(base) / "config.json").is_file():
        raise AdapterError(f"{path} is a LoRA adapter and its base checkpoint ({base or 'not named'}) is not here: "
                           "pass the base the run trained over (its --model)")
    check_fits(base, path)
    policy = load_policy(base, chat_template)
    policy.model = merge_into(policy.model, path)
    return policy


def save_policy(policy: Policy, path: str | Path, state: dict[str, torch.Tensor] | None = None) -> None:
    """Write the policy as a Hugging Face checkpoint; ``state``: its full weights when the model's
    own are not them (sharded, or trained by another backend: ``Learner.weights().host_copies()``)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    policy.model.save_pretrained(path, state_dict=state)
    policy.tokenizer.save_pretrained(path)
