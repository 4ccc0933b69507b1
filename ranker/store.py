"""Hot swap of the ranker, file based: a store directory and a watcher the SGS polls.

Layout of a store root::

    root/
      CURRENT                      # one line: the name of the live ranker directory
      r-20250101T120000.123456789-lightgbm-3f2a/   # a complete ranker directory (ranker.json + files)
      r-...

``RankerStore.publish(trained_dir)`` copies a trained ranker into ``root/<name>/`` (checked by
loading its manifest first, so a broken ranker is never published), then repoints ``CURRENT``
atomically: it writes ``CURRENT.tmp`` and renames it over ``CURRENT`` (``os.replace`` is atomic
on POSIX), so a reader sees the old name or the new one, never a partial file. Old versions are
kept (``keep`` newest; older ones are removed after the switch).

``resolve_ranker_dir(path)`` lets a command take either a saved ranker directory or a store root:
a store's ``CURRENT`` version (its newest one when ``CURRENT`` is missing), with a note saying which.

``RankerWatcher(root).get()`` returns the live ``Ranker``. Each call stats ``CURRENT`` (mtime,
size, inode) and, only when that changed, reads the name and loads the new ranker; a load that
fails is logged and the previous ranker is kept (and retried on the next change). Thread-safe:
one lock around the check and the swap; loading happens under it, so concurrent callers wait for
the new ranker instead of loading it twice. ``min_interval_s`` bounds how often the stat runs.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import threading
import time
from pathlib import Path

from ranker.base import MANIFEST, RankerFormatError, read_manifest

log = logging.getLogger(__name__)
CURRENT = "CURRENT"


class RankerStore:
    """A directory of published rankers with an atomically switched ``CURRENT`` pointer."""

    def __init__(self, root: str | Path, keep: int = 5) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.root = Path(root)
        self.keep = keep

    def current(self) -> Path | None:
        """The live ranker directory, or None when nothing was published yet."""
        pointer = self.root / CURRENT
        try:
            name = pointer.read_text().strip()
        except FileNotFoundError:
            return None
        if not name or "/" in name or name in (".", ".."):
            raise RankerFormatError(f"{pointer}: does not name a ranker directory (content {name!r})")
        return self.root / name

    def publish(self, trained_dir: str | Path, move: bool = False) -> str:
        """Copy (or move) a saved ranker into the store and make it current; returns its name."""
        trained_dir = Path(trained_dir)
        manifest = read_manifest(trained_dir)  # refuse anything that is not a loadable ranker
        self.root.mkdir(parents=True, exist_ok=True)
        ns = time.time_ns()  # names sort chronologically (UTC, nanoseconds)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(ns // 10**9)) + f".{ns % 10**9:09d}"
        name = f"r-{stamp}-{manifest['kind']}-{secrets.token_hex(2)}"
        staging = self.root / f".{name}.partial"
        if move:
            shutil.move(str(trained_dir), staging)
        else:
            shutil.copytree(trained_dir, staging)
        staging.rename(self.root / name)
        tmp = self.root / f"{CURRENT}.tmp-{secrets.token_hex(4)}"
        tmp.write_text(name + "\n")
        os.replace(tmp, self.root / CURRENT)
        self._prune(keep_name=name)
        return name

    def versions(self) -> list[Path]:
        """Published ranker directories, oldest first."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.iterdir() if p.is_dir() and p.name.startswith("r-"))

    def _prune(self, keep_name: str) -> None:
        old = [p for p in self.versions() if p.name != keep_name]
        for path in old[: max(0, len(old) - (self.keep - 1))]:
            shutil.rmtree(path, ignore_errors=True)


def resolve_ranker_dir(path: str | Path) -> tuple[Path, str | None]:
    """``path`` when it is a saved ranker (or not a store: loading it names what is missing); for a
    store root (what ``retrain_ranker`` publishes to), its ``CURRENT`` version, else its newest
    version, and a note naming the version taken."""
    path = Path(path)
    if (path / MANIFEST).is_file() or not path.is_dir():
        return path, None
    store = RankerStore(path)
    current = store.current()
    if current is not None:
        return current, f"{path} is a ranker store: using its current version {current.name}"
    versions = store.versions()
    if versions:
        return versions[-1], f"{path} is a ranker store without {CURRENT}: using its newest version {versions[-1].name}"
    return path, None


class RankerWatcher:
    """The live ranker of a store, reloaded when ``CURRENT`` changes (see the module docstring)."""

    def __init__(self, root: str | Path, min_interval_s: float = 0.0) -> None:
        self.store = RankerStore(root)
        self.min_interval_s = min_interval_s
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._checked = float("-inf")
        self._ranker = None
        self._name: str | None = None
        self.reloads = 0
        self.failures = 0

    @property
    def name(self) -> str | None:
        """The store name of the ranker ``get`` returns (None before the first load)."""
        return self._name

    def get(self):
        """The current ``Ranker`` (None when the store has none yet)."""
        now = time.monotonic()
        with self._lock:
            if now - self._checked < self.min_interval_s:
                return self._ranker
            self._checked = now
            try:
                st = (self.store.root / CURRENT).stat()
            except FileNotFoundError:
                return self._ranker
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if stamp != self._stamp:
                self._stamp = stamp
                self._reload()
            return self._ranker

    def _reload(self) -> None:
        from ranker.base import load_ranker

        try:
            path = self.store.current()
            if path is None or path.name == self._name:
                return
            ranker = load_ranker(path)
        except Exception as err:  # noqa: BLE001  (recover: keep serving the previous ranker)
            self.failures += 1
            log.error("ranker store %s: new ranker not loaded, keeping %s: %s", self.store.root, self._name, err)
            return
        self._ranker, self._name = ranker, path.name
        self.reloads += 1
        log.info("ranker store %s: now using %s (%s)", self.store.root, path.name, ranker.kind)
