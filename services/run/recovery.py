"""Recovery checkpoints on disk: written atomically, the newest complete one found, old ones pruned.

A recovery checkpoint is a directory ``run_dir/recovery/v<version>/`` holding ``state.pt``
(``torch.save`` of the trainer's state: weights, optimizer, RNGs, data cursor, the runner's
experience and staleness state, metrics so far; see ``services.run.resume``) and
``meta.json`` (version, time, sizes). It is written into ``recovery/.tmp-v<version>-<pid>/``,
every file and the directory fsynced, then renamed to its final name and the parent fsynced:
a rename is atomic, so a directory named ``v<version>`` is always complete, and a kill at any
point leaves at most a ``.tmp-*`` directory that is never read (and is removed by the next
save). ``newest`` skips anything else it does not recognise; ``prune`` keeps the newest
``keep``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

STATE = "state.pt"
META = "meta.json"
_NAME = re.compile(r"^v(\d+)$")


@dataclass(frozen=True)
class Found:
    version: int
    path: Path


def recovery_dir(run_dir: Path) -> Path:
    return run_dir / "recovery"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with path.open("rb") as f:
        os.fsync(f.fileno())


def save_atomic(root: Path, version: int, state: dict, meta: dict | None = None) -> Path:
    """Write the checkpoint of ``version`` under ``root`` (all or nothing); returns its directory."""
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):  # a save a kill interrupted
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"v{version:05d}"
    tmp = root / f".tmp-v{version:05d}-{os.getpid()}"
    tmp.mkdir()
    torch.save(state, tmp / STATE)
    info = {"version": version, "time": time.time(), "state_bytes": (tmp / STATE).stat().st_size, **(meta or {})}
    (tmp / META).write_text(json.dumps(info) + "\n")
    for f in (tmp / STATE, tmp / META):
        _fsync_file(f)
    _fsync_dir(tmp)
    if final.exists():  # the same version again (a resumed run passing it anew): replace it whole
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    return final


def complete(root: Path) -> list[Found]:
    """The complete checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        m = _NAME.match(path.name)
        if m and path.is_dir() and (path / STATE).is_file() and (path / META).is_file():
            found.append(Found(int(m.group(1)), path))
    return sorted(found, key=lambda f: f.version)


def newest(root: Path) -> Found | None:
    found = complete(root)
    return found[-1] if found else None


def prune(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints; returns what was deleted."""
    gone = [f.path for f in complete(root)[:-keep]] if keep > 0 else []
    for path in gone:
        shutil.rmtree(path, ignore_errors=True)
    return gone


def load(found: Found) -> dict:
    """The state a checkpoint holds (the trainer's own pickle: tensors and plain Python objects)."""
    meta = json.loads((found.path / META).read_text())
    if meta.get("version") != found.version:
        raise ValueError(f"{found.path}: meta.json says version {meta.get('version')}, the name {found.version}")
    return torch.load(found.path / STATE, map_location="cpu", weights_only=False)
