"""Where a run's warm start is cached, and whether it is there: torch-free, so the flow finds a
cached warm start without starting the warm-start process (``services.policy.warmstart``, which
imports torch to build one).

The key (``cache_key``) is a hash of what determines the checkpoint: the model config (a GGUF
model by its imported directory), and with demonstrations the task (the count-down distribution,
or the dataset's settings and file contents), the warm-start and evaluation settings, and an
agentic run's environment.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from services.common.config import RunConfig

MARKER = "warmstart.json"  # written last: a directory without it is not a finished warm start


def cache_key(cfg: RunConfig) -> str:
    model = cfg.model.model_dump(mode="json", exclude=set() if cfg.model.chat_template else {"chat_template"})
    if cfg.model.path:
        from services.policy.importer import imported_dir, is_gguf_spec

        if is_gguf_spec(cfg.model.path):  # the file's content, not its name
            model["path"] = str(imported_dir(cfg.model.path, cfg.cache_dir))
    if cfg.warmstart.steps == 0:  # no demonstrations: the warm start is the base model as it is
        return hashlib.sha256(json.dumps({"model": model, "format": 1}, sort_keys=True).encode()).hexdigest()[:16]
    payload = {
        "model": model,
        "task": task_identity(cfg),
        "warmstart": cfg.warmstart.model_dump(mode="json"),
        "eval": cfg.eval.model_dump(mode="json"),
        "format": 1,
    }
    if cfg.agentic.enabled:  # multi-turn demonstrations of the environment's expert instead
        a = cfg.agentic
        payload["agentic"] = {"env": a.env, a.env: getattr(a, a.env).model_dump(mode="json"), "max_turns": a.max_turns}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def task_identity(cfg: RunConfig) -> dict:
    """What determines the demonstrations: the count-down distribution, or the dataset's settings
    and the content of its files."""
    if cfg.task.kind != "dataset":
        return cfg.task.distribution()
    assert cfg.task.dataset is not None
    ds = cfg.task.dataset
    files = [f for f in (ds.train, ds.heldout) if f]
    return {**ds.model_dump(mode="json"), "seed": cfg.task.seed, "sha256": [_file_digest(Path(f)) for f in files]}


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def warmstart_dir(cfg: RunConfig) -> Path:
    """The cache directory of ``cfg``'s warm start (it may not exist yet)."""
    return Path(cfg.cache_dir) / f"warmstart-{cache_key(cfg)}"


def cached_warmstart(cfg: RunConfig) -> Path | None:
    """The finished warm start of ``cfg`` in its cache, or None."""
    out = warmstart_dir(cfg)
    return out if (out / MARKER).is_file() else None
