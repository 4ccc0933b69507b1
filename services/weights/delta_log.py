"""A relay's log of the deltas its versions arrived as, and the deltas it composes from them.

A relay keeps K whole versions (``VersionStore``) but the deltas they arrived as are small (a few
percent of a version in bfloat16), so it keeps the last ``keep`` of them here, beyond K. A puller
several versions behind (an instance that was busy while versions went by) then still takes a
delta: the chain from the version it holds to the one it asks for, composed into one
(``delta_version.compose``: the union of the positions each step changed, with the newest values),
made once per (held version, wanted version) and kept while the wanted version is held.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from services.weights import delta_blob as DB
from services.weights import delta_version as DV
from services.weights.store import Stored

KEEP = 16  # deltas kept beyond the whole versions (each a few percent of a version in bfloat16) ...
# ... and together never more bytes than one whole version (a float32 delta is ~40% of one)


@dataclass(frozen=True)
class Entry:
    base: int
    base_digest: str
    version: int
    digest: str  # the whole version's the delta leads to
    delta: Stored


class DeltaLog:
    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self._by_base: dict[int, Entry] = {}
        self._composed: dict[tuple[int, str, int], Stored] = {}
        self._lock = threading.Lock()  # the log and the cache
        self._composing = threading.Lock()  # one composition at a time: each costs a core-second or so

    def add(self, full: Stored) -> None:
        """Log the delta ``full`` arrived as (``full.delta``); the oldest go beyond ``keep`` deltas
        or beyond one whole version's bytes in all."""
        if full.delta is None:
            return
        with self._lock:
            self._by_base[full.delta_base] = Entry(full.delta_base, full.delta_base_digest, full.version, full.digest,
                                                   full.delta)
            while len(self._by_base) > self.keep or (
                    len(self._by_base) > 1 and self._bytes() > full.manifest.total_bytes):
                self._by_base.pop(min(self._by_base)).delta.blob.release()

    def _bytes(self) -> int:
        return sum(e.delta.manifest.total_bytes for e in self._by_base.values())

    def logged(self) -> tuple[list[int], int]:
        """The versions whose deltas are logged, and their bytes in all."""
        with self._lock:
            return sorted(e.version for e in self._by_base.values()), self._bytes()

    def forget(self, held: set[int]) -> None:
        """Drop composed deltas to versions no longer held."""
        with self._lock:
            for key in [k for k in self._composed if k[2] not in held]:
                self._composed.pop(key).blob.release()

    def chain(self, have_version: int, have_digest: str, full: Stored) -> list[Entry] | None:
        """The logged deltas from the held version to ``full``, in order, or None."""
        out, cur = [], (have_version, have_digest)
        with self._lock:
            while cur[0] < full.version:
                e = self._by_base.get(cur[0])
                if e is None or e.base_digest != cur[1] or e.version > full.version:
                    return None
                out.append(e)
                cur = (e.version, e.digest)
        return out if cur == (full.version, full.digest) else None

    def for_puller(self, full: Stored, have_version: int, have_digest: str) -> Stored:
        """What to send a puller holding ``have_version`` (digest ``have_digest``) that wants
        ``full``: the delta ``full`` arrived as when it leads from there, a delta composed from the
        logged chain, or ``full`` itself."""
        direct = full.source(have_version, have_digest)
        if direct is not full or have_version >= full.version:
            return direct
        key = (have_version, have_digest, full.version)
        with self._composing:
            with self._lock:
                hit = self._composed.get(key)
            if hit is not None:
                return hit
            chain = self.chain(have_version, have_digest, full)
            if chain is None:
                return full
            frames = DV.compose(full.manifest, full.blob.view,
                                [DB.frames_of(e.delta.manifest, e.delta.blob.view) for e in chain])
            stored = _stored(full, frames)
            with self._lock:
                self._composed[key] = stored
            return stored

    def close(self) -> None:
        with self._lock:
            for e in self._by_base.values():
                e.delta.blob.release()
            for s in self._composed.values():
                s.blob.release()
            self._by_base.clear()
            self._composed.clear()


def _stored(full: Stored, frames: list[bytes]) -> Stored:
    """A composed delta to ``full`` as the store holds one: its blob, chunk digests (in the algorithm
    of ``full``'s) and its own version digest."""
    wb = DB.pack(frames, full.manifest.chunk_bytes)
    algo = full.digests[0].partition(":")[0] if full.digests else "xxh3_128"
    digests, digest = DV.version_digests(wb.manifest, wb.blob.view, algo)
    return Stored(full.version, wb.manifest, wb.blob, tuple(digests), digest)
