"""Atomic file replacement: a reader sees the old file or the new one, never a part.

Port files, membership lists and state files are read by other processes while their writer may
be replacing them (or be killed mid-write). The text goes to a uniquely named temporary file in
the target's directory (same file system, so the rename is atomic; unique, so two writers of one
path never share a temporary file), is flushed to disk, and then ``os.replace``s the target. On
any failure the temporary file is removed and the target is left as it was.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (created with the usual permissions, umask applied)."""
    path = Path(path)
    # dot-prefixed and ending in .tmp: no reader globbing for the target's name or suffix picks it up
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with tmp.open("xb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())  # the data is on disk before the name points at it (a crash leaves no empty file)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | Path, text: str, encoding: str = "utf-8") -> None:
    """Replace ``path`` with ``text`` atomically."""
    write_bytes_atomic(path, text.encode(encoding))


def write_json_atomic(path: str | Path, obj: Any, *, indent: int | None = None) -> None:
    """Replace ``path`` with ``obj`` as JSON and a final newline, atomically."""
    write_text_atomic(path, json.dumps(obj, indent=indent) + "\n")
