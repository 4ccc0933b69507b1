"""What an engine needs to know about a local Hugging Face checkpoint, checked before it starts.

Every engine serves a local checkpoint directory (``config.json``, safetensors, a tokenizer): the
built-in tiny policy or a user's Qwen2/Qwen2.5/Llama model. ``inspect_checkpoint`` reads the config
(never the hub), rejects what no shipped engine can serve with a message naming the directory and
the offending value, and returns the facts the SGS validates requests and weight updates against:
vocabulary size, context length, EOS ids, and the Hugging Face tensor names, dtypes and shapes a
weight update must carry (built on the meta device: no memory, no weights read).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from services.common.weights import TensorSpec, specs_of

# Architectures whose Hugging Face tensor names every shipped engine loads (vLLM's Qwen2 and Llama
# loaders; transformers' classes for the fallback engine). Qwen2.5 checkpoints use Qwen2's class.
SUPPORTED_ARCHITECTURES = ("Qwen2ForCausalLM", "LlamaForCausalLM")


class CheckpointError(ValueError):
    """The directory is not a checkpoint this engine can serve (the message says why)."""


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    architecture: str
    vocab_size: int
    max_positions: int
    eos_ids: tuple[int, ...]
    head_dim: int
    num_layers: int
    num_kv_heads: int


def _read_config(path: Path) -> dict:
    if not path.is_dir():
        raise CheckpointError(f"model directory {path} does not exist")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"{path} is not a Hugging Face checkpoint: no config.json")
    try:
        cfg = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{cfg_file} is not valid JSON: {err}") from None
    if not any(path.glob("*.safetensors")):
        raise CheckpointError(f"{path} has no *.safetensors weight files (save with save_pretrained)")
    return cfg


def inspect_checkpoint(path: str | Path) -> CheckpointInfo:
    """Validate ``path`` and return its facts; raises ``CheckpointError`` with the reason."""
    path = Path(path)
    cfg = _read_config(path)
    archs = cfg.get("architectures") or []
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        raise CheckpointError(
            f"{path}: architecture {archs or '(none in config.json)'} is not supported; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    try:
        heads, hidden = int(cfg["num_attention_heads"]), int(cfg["hidden_size"])
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        eos = cfg["eos_token_id"]
        info = CheckpointInfo(
            path=path,
            architecture=arch,
            vocab_size=int(cfg["vocab_size"]),
            max_positions=int(cfg["max_position_embeddings"]),
            eos_ids=tuple(int(e) for e in (eos if isinstance(eos, list) else [eos])),
            head_dim=head_dim,
            num_layers=int(cfg["num_hidden_layers"]),
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{path}/config.json lacks or garbles a field the engines need: {err!r}") from None
    if not info.eos_ids:
        raise CheckpointError(f"{path}/config.json has no eos_token_id: samples could never end")
    return info


def tensor_specs(path: str | Path, dtype: torch.dtype) -> dict[str, TensorSpec]:
    """Hugging Face names, ``dtype`` and shapes of the checkpoint's model (a weight update's schema).

    The model is built from its config on the meta device, so this reads no weights. Tied
    embeddings appear under both names, as in the trainer's ``state_dict``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path, local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return specs_of(model.state_dict())
