"""LoRA adapters (``trainer.lora``): the one place Braid meets peft.

With ``trainer.lora`` set, the trainer trains a LoRA adapter over a frozen base, the weight plane
carries only the adapter (every version is an adapter: its tensors under peft's saved names, e.g.
``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``, float32), and the SGS serves
base + adapter (vLLM's LoRA API; the ``hf`` engine through peft). Version 0 is the base itself:
a fresh adapter's ``lora_B`` is zero, so base + adapter v0 = base.

On disk an adapter is peft's format (``adapter_config.json`` + ``adapter_model.safetensors``), which
vLLM's ``LoRARequest`` and ``peft.PeftModel.from_pretrained`` both read; ``merge`` folds one into
its base and writes a plain Hugging Face checkpoint (``braid model merge``).

The config (``LoraConfig``) is ``services.common.lora_config``, a schema module; torch,
transformers and peft are imported inside the functions here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from services.common.lora_config import LoraConfig

if TYPE_CHECKING:
    import torch

    from services.common.weights import TensorSpec

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def peft_config(cfg: LoraConfig, base_path: str | Path | None = None):
    """The ``peft.LoraConfig`` equivalent to ``cfg``."""
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(
        r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=list(cfg.target_modules),
        bias="none", task_type="CAUSAL_LM", base_model_name_or_path=str(base_path) if base_path else None,
    )


class AdapterError(ValueError):
    """An adapter cannot be built, read or merged (the message says why)."""


def wrap(model, cfg: LoraConfig):
    """``model`` with fresh adapters on ``cfg.target_modules`` (peft's ``get_peft_model``): only the
    adapters train; ``lora_B`` starts at zero, so the wrapped model computes what the base does."""
    from peft import get_peft_model

    try:
        return get_peft_model(model, peft_config(cfg, getattr(model.config, "_name_or_path", None)))
    except ValueError as err:  # peft: "Target modules {...} not found in the base model"
        names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if type(m).__name__ == "Linear"})
        raise AdapterError(f"trainer.lora.target_modules {cfg.target_modules}: {err} (this model's linear "
                           f"modules: {names})") from err


def adapter_state(model) -> dict[str, torch.Tensor]:
    """The adapter's tensors of a wrapped model under peft's saved names (no base weights)."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(model)


def adapter_specs(model_path: str | Path, cfg: LoraConfig) -> dict[str, TensorSpec]:
    """Names, dtypes (float32) and shapes of the adapter ``cfg`` puts on the checkpoint at
    ``model_path``, worked out on the meta device (no weights are read or allocated)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from services.common.weights import specs_of

    config = AutoConfig.from_pretrained(model_path, local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return specs_of(adapter_state(wrap(model, cfg)))


def save_adapter(out: str | Path, state: dict[str, torch.Tensor], cfg: LoraConfig,
                 base_path: str | Path | None = None) -> Path:
    """Write ``state`` as a peft adapter directory (what vLLM's ``LoRARequest`` and peft load)."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    peft_config(cfg, base_path).save_pretrained(str(out))
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(out / ADAPTER_WEIGHTS))
    return out


def read_adapter(path: str | Path) -> tuple[LoraConfig, dict[str, torch.Tensor]]:
    """An adapter directory's config and tensors; ``AdapterError`` naming what is missing or wrong."""
    from safetensors.torch import load_file

    path = Path(path)
    missing = [n for n in (ADAPTER_CONFIG, ADAPTER_WEIGHTS) if not (path / n).is_file()]
    if missing:
        raise AdapterError(f"{path} is not a LoRA adapter directory: no {' or '.join(missing)}")
    raw = json.loads((path / ADAPTER_CONFIG).read_text())
    if raw.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{path}: peft_type {raw.get('peft_type')!r} is not LORA")
    targets = raw.get("target_modules") or []
    cfg = LoraConfig(rank=raw.get("r", 8), alpha=raw.get("lora_alpha", 8), dropout=raw.get("lora_dropout", 0.0),
                     target_modules=sorted(targets) if isinstance(targets, list | set) else [targets])
    return cfg, load_file(str(path / ADAPTER_WEIGHTS))


# Files of a checkpoint's tokenizer that a merged checkpoint takes from its base, when present.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "added_tokens.json", "chat_template.jinja", "generation_config.json")


@dataclass(frozen=True)
class MergeReport:
    """What ``merge`` wrote (``braid model merge`` prints it as JSON)."""

    base: str
    adapter: str
    out: str
    rank: int
    alpha: float
    adapter_bytes: int  # the adapter's tensors as stored
    adapter_tensors: int
    merged_modules: int  # base linear layers the adapter changed (one lora_A/lora_B pair each)
    tokenizer_files: list[str]


def check_fits(base_path: str | Path, adapter_path: str | Path) -> tuple[LoraConfig, dict[str, torch.Tensor]]:
    """The adapter's config and tensors, once its tensor names and shapes are exactly those its
    config puts on the base at ``base_path`` (``adapter_specs``); ``AdapterError`` naming the
    misfits otherwise."""
    from services.common.weights import specs_of

    if not (Path(base_path) / "config.json").is_file():
        raise AdapterError(f"{base_path} is not a Hugging Face checkpoint directory (no config.json)")
    cfg, state = read_adapter(adapter_path)
    want, got = adapter_specs(base_path, cfg), specs_of(state)
    unknown, missing = sorted(set(got) - set(want)), sorted(set(want) - set(got))
    wrong = [f"{k}: {list(got[k].shape)} (the base needs {list(want[k].shape)})"
             for k in got if k in want and got[k].shape != want[k].shape]
    if unknown or missing or wrong:
        raise AdapterError(f"the adapter at {adapter_path} does not fit the base at {base_path}: "
                           f"{len(wrong)} tensors of the wrong shape {wrong[:3]}, {len(unknown)} the base has no place "
                           f"for {unknown[:3]}, {len(missing)} missing {missing[:3]}")
    return cfg, state


def merge_into(model, adapter_path: str | Path):
    """``model`` (the adapter's base, loaded) with the adapter at ``adapter_path`` folded into its
    weights: a plain Hugging Face model (peft's ``merge_and_unload``)."""
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(adapter_path), is_trainable=False).merge_and_unload()


def adapter_base(adapter_path: str | Path) -> str | None:
    """The base checkpoint an adapter directory names (``base_model_name_or_path``), if any."""
    raw = json.loads((Path(adapter_path) / ADAPTER_CONFIG).read_text())
    return raw.get("base_model_name_or_path") or None


def merge(base_path: str | Path, adapter_path: str | Path, out: str | Path) -> MergeReport:
    """Fold the adapter at ``adapter_path`` into the checkpoint at ``base_path`` and write the
    result to ``out`` as a plain Hugging Face checkpoint (float32 weights, the base's tokenizer
    files), one ``braid run --model`` and every engine load."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    cfg, state = check_fits(base_path, adapter_path)
    model = AutoModelForCausalLM.from_pretrained(base_path, local_files_only=True, dtype=torch.float32)
    merged = merge_into(model, adapter_path)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(out)
    copied = [n for n in TOKENIZER_FILES if (Path(base_path) / n).is_file()]
    for name in copied:
        shutil.copyfile(Path(base_path) / name, out / name)
    return MergeReport(str(base_path), str(adapter_path), str(out), cfg.rank, cfg.alpha,
                       (Path(adapter_path) / ADAPTER_WEIGHTS).stat().st_size, len(state),
                       sum(1 for k in state if ".lora_A." in k), copied)
