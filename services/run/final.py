"""The trained model handed back: ``runs/<id>/final/``.

After the final evaluation the trainer (rank 0: with FSDP2 the weights are gathered there once,
each tensor a collective the other ranks join) writes the policy it ends with, the one that
evaluation scored, as a Hugging Face checkpoint that ``AutoModelForCausalLM.from_pretrained`` and
vLLM load and ``braid eval`` scores:

```
final/config.json, generation_config.json, model.safetensors   the weights (Hugging Face names)
final/tokenizer.json, tokenizer_config.json, chat_template.jinja  the tokenizer (and template, when it has one)
final/final.json                                               iteration, weight version, held-out accuracy
                                                               and standard error, every suite's, the config
                                                               and its digest
final/adapter/adapter_config.json, adapter_model.safetensors   trainer.lora only: the adapter, naming its base
```

With ``trainer.lora`` the top level is the adapter folded into the base the run trained over
(``services.common.lora.merge``, what ``braid model merge`` does; ``final.json`` carries that
command too). The directory is built under a temporary name in the run directory and renamed into
place, so ``final/`` is either absent or complete; a restarted trainer that finishes again
replaces it.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import time
from pathlib import Path

from services.common.atomic import write_json_atomic
from services.common.config import RunConfig
from services.run.evaluate import EvalResult

FINAL_DIR = "final"
META = "final.json"
ADAPTER_DIR = "adapter"


def config_digest(cfg: RunConfig) -> str:
    """A short digest of the resolved config (key order and formatting do not matter)."""
    text = json.dumps(cfg.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def final_meta(cfg: RunConfig, result: EvalResult, *, version: int, fingerprint: str, config_path: str,
               final: Path, base: str | None, suites: dict[str, dict] | None = None) -> dict:
    """``final.json``: what the checkpoint is and how it scored (pure); ``suites``: every evaluation
    suite's score (``suite_scores``)."""
    adapter = cfg.trainer.lora is not None
    config = str(Path(config_path).resolve())
    meta = {
        "iteration": version,  # the trainer's steps: trainer.iterations, unless the run stopped early
        "weight_version": version,
        "mode": cfg.trainer.mode,
        "accuracy": result.accuracy,
        "stderr": result.stderr,
        "eval_prompts": result.prompts,
        "eval_fingerprint": fingerprint,
        "config": config,
        "config_digest": config_digest(cfg),
        "base": base,
        "adapter": str(final / ADAPTER_DIR) if adapter else None,
        "suites": suites or {},
        "eval_command": f"braid eval --model {final} --config {config}",
        "written_at": time.time(),
    }
    if adapter:
        meta["merge_command"] = f"braid model merge --base {base} --adapter {final / ADAPTER_DIR} --out <dir>"
    return meta


def replace_dir(tmp: Path, dest: Path) -> None:
    """Put the complete directory ``tmp`` at ``dest`` by renames (same file system); an old ``dest``
    is moved aside first and removed after."""
    old = dest.with_name(f".{dest.name}.{secrets.token_hex(4)}.old")
    if dest.exists():
        os.replace(dest, old)
    os.replace(tmp, dest)
    shutil.rmtree(old, ignore_errors=True)


def drop_tied(state: dict, config) -> dict:
    """``state`` without ``lm_head.weight`` when ``config`` ties the output layer to the input
    embeddings and the tensor is their copy: a full-weights version carries both (113 MB more for
    SmolLM2-135M); the loaders tie it again."""
    import torch

    head, embed = state.get("lm_head.weight"), state.get("model.embed_tokens.weight")
    if not getattr(config, "tie_word_embeddings", False) or head is None or embed is None:
        return state
    return {k: v for k, v in state.items() if k != "lm_head.weight"} if torch.equal(head, embed) else state


def suite_scores(results: dict[str, EvalResult], fingerprints: dict[str, str]) -> dict[str, dict]:
    """Each suite's accuracy, standard error, prompts and prompt-set fingerprint (``final.json``, ``braid eval``)."""
    return {name: {"accuracy": r.accuracy, "stderr": r.stderr, "prompts": r.prompts,
                   "fingerprint": fingerprints.get(name)} for name, r in results.items()}


def write_final(trainer, result: EvalResult, config_path: str, suites: dict[str, EvalResult] | None = None) -> Path:
    """Write ``trainer``'s current policy (the one ``result`` scored, and ``suites``) to ``<run_dir>/final``
    and return its absolute path."""
    from services.common.lora import merge, save_adapter
    from services.policy.model import save_policy

    cfg = trainer.cfg
    final = (Path(trainer.run_dir) / FINAL_DIR).resolve()
    tmp = final.with_name(f".{FINAL_DIR}.{secrets.token_hex(4)}.tmp")
    state = trainer.learner.weights().host_copies()  # gathered from every rank; Hugging Face names
    base = trainer.model_dir or cfg.model.path  # the checkpoint the run trained from (an adapter's base)
    base = str(Path(base).resolve()) if base else None
    try:
        if cfg.trainer.lora is None:
            save_policy(trainer.policy, tmp, drop_tied(state, trainer.policy.model.config))
        else:
            save_adapter(tmp / ADAPTER_DIR, state, cfg.trainer.lora, base)
            merge(base, tmp / ADAPTER_DIR, tmp)
        scores = suite_scores(suites or {}, {s.name: s.fingerprint for s in trainer.suites})
        meta = final_meta(cfg, result, version=trainer.version, fingerprint=trainer.eval_fingerprint(),
                          config_path=config_path, final=final, base=base, suites=scores)
        write_json_atomic(tmp / META, meta, indent=2)
        replace_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def read_meta(path: str | Path) -> dict | None:
    """A checkpoint directory's ``final.json`` (a run's ``final/``), or None."""
    meta = Path(path) / META
    return json.loads(meta.read_text()) if meta.is_file() else None
