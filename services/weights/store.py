"""The relay's version store: the latest K versions in CPU memory, with read/write locking.

A version lives in one flat ``Blob`` (tensors back to back in the manifest's order; see
``services.common.weights.Manifest``). With ``shm_dir`` the blob is a file in shared memory
(``/dev/shm``), so a reader on the same host maps it instead of streaming it (Laminar §6's
pinned shared memory, our PCIe analogue); otherwise it is anonymous memory.

Locking (a push never exposes a half-written version; concurrent pulls proceed):

- An arriving version is an ``Incoming``: chunks from any number of parallel streams are
  validated (index in range and of this stream's part, strictly increasing per stream, never
  duplicated, name/offset/length as the plan says, chunk digest) and written into disjoint
  ranges of its blob. Readers cannot see it; only the relay's own forwarders read its
  contiguous prefix (pipelined broadcast).
- ``commit`` checks that every chunk is in and that the version digest matches, then moves it
  to the committed map under the store lock (the writer side) and evicts the oldest beyond K.
- A reader ``pin``s a committed version for the duration of a pull; committed bytes are never
  written again, and an evicted version's file is unlinked only when its last pin goes (its
  memory lives until the last reference, e.g. a same-host reader's mapping, is dropped).
  Eviction hands the store's reference to a reaper thread: unmapping and freeing a version
  (~0.2 s per GB here) never lands in the commit that evicted it, i.e. in a push's reply.

A version may arrive as a delta from a held version (``begin(delta_base=...)``, layout in
``delta_blob``): its chunks are checked and locked like any version's, and ``try_commit`` turns it
into the full version (the base copied, the delta applied, the publisher's digest checked), which
is what readers see; the delta stays beside it (``Stored.delta``) for pullers holding the base.

Refusals are ``WeightError`` (kind argument / precondition / integrity / not_found), mapped to
gRPC status codes at the edge. A refused push discards its ``Incoming``; committed versions are
untouched.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from services.common.weights import Chunk, Manifest, WeightError, check_chunk_digest, version_digest
from services.weights.blob import Blob, memory_bytes


@dataclass
class Stored:
    version: int
    manifest: Manifest
    blob: Blob
    digests: tuple[str, ...]
    digest: str
    pins: int = 0
    evicted: bool = False
    delta: Stored | None = None  # the delta this version arrived as (served to a puller holding its base)
    delta_base: int = -1
    delta_base_digest: str = ""

    @property
    def prefix(self) -> int:  # every chunk is in (forwarders treat both kinds alike)
        return len(self.digests)

    def source(self, have_version: int, have_digest: str) -> Stored:
        """What to send a puller holding ``have_version`` (digest ``have_digest``): the delta from it
        when this version arrived as one, else the version itself."""
        if self.delta is not None and (self.delta_base, self.delta_base_digest) == (have_version, have_digest):
            return self.delta
        return self

    def release(self) -> None:
        self.blob.release()
        if self.delta is not None:
            self.delta.blob.release()


@dataclass
class Incoming:
    version: int
    manifest: Manifest
    blob: Blob
    digests: list[str | None]
    received: int = 0
    prefix: int = 0  # chunks 0..prefix-1 are all in
    digest: str | None = None
    updated: float = field(default_factory=time.monotonic)
    active: int = 0  # push streams writing it now
    delta_base: int | None = None  # a delta from this committed version (``delta_blob``)
    applying: bool = False  # a committing stream is applying the delta (outside the store lock)


def wait_limit(wait_s: float, limit_s: float) -> float:
    """A caller's wait clamped to [0, ``limit_s``]; NaN is refused (a wait that never times out)."""
    if math.isnan(wait_s):
        raise WeightError("argument", f"wait_s must be a number of seconds, got {wait_s}")
    return min(max(wait_s, 0.0), limit_s)


class VersionStore:
    def __init__(self, keep: int, shm_dir: Path | None, max_version_bytes: int | None = None) -> None:
        self.keep = keep
        self.shm_dir = shm_dir
        self.max_version_bytes = memory_bytes() if max_version_bytes is None else max_version_bytes
        self.cond = threading.Condition()
        self.committed: dict[int, Stored] = {}
        self.incoming: dict[int, Incoming] = {}
        self.fingerprint: str | None = None
        self._spare: Blob | None = None  # a pre-faulted blob for the next arriving version
        self._preparing = False
        self._populating = False
        self._reaper: queue.SimpleQueue[Stored | None] | None = None  # evicted versions to free (``_retire``)

    # ------------------------------------------------------------------ queries
    def held(self) -> list[int]:
        with self.cond:
            return sorted(self.committed)

    def latest(self) -> int:
        with self.cond:
            return max(self.committed, default=-1)

    # ------------------------------------------------------------------ writing
    def begin(self, version: int, manifest: Manifest, *, blob: Blob | None = None,
              delta_base: int | None = None) -> Incoming:
        """Start (or join, for another parallel stream or a resumed one) an arriving version;
        ``delta_base``: it arrives as the delta from that version, which must be held here."""
        manifest.validate()
        if delta_base is not None:
            from services.weights.delta_blob import check_layout

            check_layout(manifest)
        if manifest.total_bytes > self.max_version_bytes:
            raise WeightError("resource", f"version {version} has {manifest.total_bytes} bytes; this relay holds "
                                          f"at most {self.max_version_bytes} per version (its memory)")
        with self.cond:
            if delta_base is not None:
                self._check_base(version, delta_base)
            elif self.fingerprint is not None and manifest.fingerprint() != self.fingerprint:
                raise WeightError(
                    "precondition",
                    f"version {version} has a different model's parameters (fingerprint {manifest.fingerprint()}); "
                    f"this relay holds fingerprint {self.fingerprint}",
                )
            if version in self.committed:
                raise WeightError("exists", f"version {version} is already held")
            newest = max(self.committed, default=-1)
            if version < newest:
                raise WeightError("precondition", f"version {version} is older than the newest held version {newest}")
            inc = self.incoming.get(version)
            if inc is not None:
                if inc.manifest != manifest or inc.delta_base != delta_base:
                    raise WeightError("argument", f"version {version}: manifest differs from the one already arriving")
                return inc
            deadline = time.monotonic() + 5.0
            while blob is None and delta_base is None and self._populating and time.monotonic() < deadline:
                self.cond.wait(0.05)  # a spare is being faulted in: faster to wait for it than to start over
            if blob is None and self._spare is not None and self._spare.size == manifest.total_bytes:
                blob, self._spare = self._spare, None
            inc = Incoming(version, manifest, blob or Blob(manifest.total_bytes, self.shm_dir),
                           [None] * len(manifest.plan), delta_base=delta_base)
            self.incoming[version] = inc
            return inc

    def _check_base(self, version: int, base: int) -> None:
        """A delta arrives only onto a held base (under the lock)."""
        if base >= version:
            raise WeightError("argument", f"a delta leads to a newer version: {base} -> {version}")
        if base not in self.committed:
            raise WeightError("precondition", f"delta {base} -> {version}: base version {base} is not held "
                                              f"here (versions held: {sorted(self.committed)}); send it whole")

    def add(self, inc: Incoming, chunk: Chunk, part: int, parts: int, last_index: int) -> None:
        """Validate ``chunk`` (the previous index of its stream was ``last_index``) and place it."""
        plan = inc.manifest.plan
        i = chunk.index
        if chunk.version != inc.version:
            raise WeightError("argument", f"chunk of version {chunk.version} in a push of version {inc.version}")
        if not 0 <= i < len(plan):
            raise WeightError(
                "argument", f"chunk index {i} out of range (version {inc.version} has {len(plan)} chunks)"
            )
        if i <= last_index:
            raise WeightError("argument", f"chunk {i} after chunk {last_index}: chunks out of order or duplicated")
        if parts > 1 and i % parts != part:
            raise WeightError("argument", f"chunk {i} does not belong to part {part} of {parts}")
        ref = plan[i]
        if chunk.name != ref.name or chunk.offset != ref.tensor_offset or len(chunk.data) != ref.length:
            raise WeightError(
                "argument",
                f"chunk {i}: got {chunk.name!r} at {chunk.offset} ({len(chunk.data)} bytes), the manifest says "
                f"{ref.name!r} at {ref.tensor_offset} ({ref.length} bytes)",
            )
        if not check_chunk_digest(chunk.data, chunk.chunk_digest):
            raise WeightError("integrity", f"chunk {i} ({ref.name!r} at {ref.tensor_offset}): digest mismatch")
        with self.cond:
            if inc.digests[i] is not None:
                raise WeightError("argument", f"chunk {i} of version {inc.version} duplicated")
            inc.digests[i] = ""  # claimed: no other stream may write this range
        inc.blob.view[ref.blob_offset : ref.blob_offset + ref.length] = chunk.data
        with self.cond:
            inc.digests[i] = chunk.chunk_digest
            inc.received += 1
            while inc.prefix < len(plan) and inc.digests[inc.prefix]:
                inc.prefix += 1
            inc.updated = time.monotonic()
            self.cond.notify_all()

    def receive(self, inc: Incoming, index: int, digest: str, last_index: int, fill) -> bool:
        """The data channel's ``add``: ``fill(view)`` writes chunk ``index`` straight into its place
        in the blob (``recv_into``), then its bytes are checked against ``digest``. Returns False
        (bytes read and dropped) for a chunk already held from an earlier stream (a resume).
        Readers never see the range: it counts only once its digest checked out."""
        plan = inc.manifest.plan
        if not 0 <= index < len(plan):
            raise WeightError(
                "argument", f"chunk index {index} out of range (version {inc.version} has {len(plan)} chunks)"
            )
        if index <= last_index:
            raise WeightError("argument", f"chunk {index} after chunk {last_index}: chunks out of order or duplicated")
        ref = plan[index]
        with self.cond:
            held = inc.digests[index] is not None
            if not held:
                inc.digests[index] = ""  # claimed: no other stream may write this range
        if held:
            fill(memoryview(bytearray(ref.length)))
            return False
        try:
            view = inc.blob.view[ref.blob_offset : ref.blob_offset + ref.length]
            fill(view)
            if not check_chunk_digest(view, digest):
                raise WeightError("integrity", f"chunk {index} ({ref.name!r} at {ref.tensor_offset}): digest mismatch")
        except BaseException:
            with self.cond:
                inc.digests[index] = None  # unclaimed: a resume may send it again
            raise
        with self.cond:
            inc.digests[index] = digest
            inc.received += 1
            while inc.prefix < len(plan) and inc.digests[inc.prefix]:
                inc.prefix += 1
            inc.updated = time.monotonic()
            self.cond.notify_all()
        return True

    def add_digests(self, inc: Incoming, digests: list[str]) -> None:
        """Push by reference: the blob is already in place; check every chunk against its digest."""
        plan = inc.manifest.plan
        if len(digests) != len(plan):
            raise WeightError("argument", f"{len(digests)} chunk digests for {len(plan)} chunks")
        for ref, d in zip(plan, digests, strict=True):
            if not check_chunk_digest(inc.blob.view[ref.blob_offset : ref.blob_offset + ref.length], d):
                raise WeightError(
                    "integrity", f"chunk {ref.index} ({ref.name!r} at {ref.tensor_offset}): digest mismatch"
                )
        with self.cond:
            inc.digests = list(digests)
            inc.received = inc.prefix = len(plan)
            self.cond.notify_all()

    def set_digest(self, inc: Incoming, digest: str) -> None:
        with self.cond:
            if inc.digest is not None and inc.digest != digest:
                raise WeightError(
                    "integrity", f"version {inc.version}: parallel streams disagree on the version digest"
                )
            inc.digest = digest
            self.cond.notify_all()

    def try_commit(self, inc: Incoming) -> bool:
        """Commit ``inc`` if complete; raise on a version digest mismatch; False if incomplete. A
        delta commits the full version it leads to (applied to a copy of its base, outside the lock,
        its digest checked against the publisher's); a delta that does not apply is discarded."""
        with self.cond:
            while inc.applying:  # another stream of this version is applying it
                self.cond.wait(0.5)
            if inc.version in self.committed:
                return True
            if inc.received < len(inc.digests) or inc.digest is None:
                return False
            if version_digest(inc.digests) != inc.digest:  # type: ignore[arg-type]
                raise WeightError("integrity", f"version digest mismatch for version {inc.version}")
            own = Stored(inc.version, inc.manifest, inc.blob, tuple(inc.digests), inc.digest)  # type: ignore[arg-type]
            if inc.delta_base is None:
                self._add(inc, own)
                return True
            base = self.committed.get(inc.delta_base)
            if base is None:
                self.incoming.pop(inc.version, None)
                inc.blob.release()
                raise WeightError("precondition", f"delta {inc.delta_base} -> {inc.version}: its base was evicted "
                                                  f"before it was complete; send version {inc.version} whole")
            base.pins += 1
            inc.applying = True
        try:
            full = self._materialize(base, own)
        except BaseException:
            with self.cond:
                self.incoming.pop(inc.version, None)
                inc.blob.release()
            raise
        finally:
            with self.cond:
                inc.applying = False
                self._unpin(base)
                self.cond.notify_all()
        with self.cond:
            self._add(inc, full)
        return True

    def _add(self, inc: Incoming, stored: Stored) -> None:
        """Make ``stored`` (what ``inc`` became) visible (under the lock)."""
        self.incoming.pop(inc.version, None)
        self.committed[inc.version] = stored
        self.fingerprint = stored.manifest.fingerprint()
        self._evict()
        self.cond.notify_all()

    def _materialize(self, base: Stored, delta: Stored) -> Stored:
        """The full version ``delta`` leads to from ``base`` (pinned by the caller)."""
        from services.weights.delta_blob import Held, materialize

        blob = Blob(base.manifest.total_bytes, self.shm_dir)
        try:
            applied = materialize(Held(base.version, base.manifest, base.blob.view, base.digest), delta.manifest,
                                  delta.blob.view, blob.view)
            if applied.version != delta.version:
                raise WeightError("argument", f"a delta to version {applied.version} pushed as version {delta.version}")
        except BaseException:
            blob.release()
            raise
        return Stored(delta.version, base.manifest, blob, applied.chunk_digests, applied.digest, delta=delta,
                      delta_base=base.version, delta_base_digest=base.digest)

    def _unpin(self, stored: Stored) -> None:
        stored.pins -= 1
        if stored.evicted and stored.pins == 0:
            stored.release()

    def attach(self, inc: Incoming) -> None:
        with self.cond:
            inc.active += 1

    def detach(self, inc: Incoming, refused: bool) -> None:
        """A push stream ended. After a refusal, an arriving version no other stream is writing
        is dropped (a clean retry starts afresh); a stream that merely broke (its sender died)
        leaves it for a resume from its received prefix."""
        with self.cond:
            inc.active -= 1
            drop = refused and inc.active == 0
        if drop:
            self.discard(inc)

    def discard(self, inc: Incoming) -> None:
        """Drop an arriving version (committed versions are untouched)."""
        with self.cond:
            if self.incoming.get(inc.version) is inc:
                del self.incoming[inc.version]
                inc.blob.release()
            self.cond.notify_all()

    def drop_stale(self, idle_s: float) -> list[int]:
        """Drop arriving versions that made no progress for ``idle_s`` (an upstream died and no
        one resumed them); returns their versions."""
        now = time.monotonic()
        with self.cond:
            stale = [v for v, inc in self.incoming.items() if now - inc.updated > idle_s]
            for v in stale:
                self.incoming.pop(v).blob.release()
            return stale

    def prepare_spare(self, size: int, quiet_s: float = 0.3) -> None:
        """Allocate and fault in a blob of ``size`` for the next arriving version, on a background
        thread (a network push then lands at memory speed: no page fault per 4 KiB in ``recv_into``).
        It waits until no version is being read or written for ``quiet_s`` first, so it never
        competes with the fan-out of the version just committed. The relay holds at most K
        versions plus this one."""
        with self.cond:
            if self._preparing or (self._spare is not None and self._spare.size == size):
                return
            self._preparing = True

        def run() -> None:
            spare = None
            try:
                self._wait_quiet(quiet_s)
                with self.cond:
                    self._populating = True
                spare = Blob(size, self.shm_dir, populate=True)
            finally:
                with self.cond:
                    self._preparing = self._populating = False
                    self.cond.notify_all()
                    old, self._spare = self._spare, spare
                if old is not None:
                    old.release()

        threading.Thread(target=run, name="spare-blob", daemon=True).start()

    def _wait_quiet(self, quiet_s: float, limit_s: float = 600.0) -> None:
        deadline = time.monotonic() + limit_s
        quiet_since = time.monotonic()
        with self.cond:
            while time.monotonic() < deadline:
                busy = self.incoming or any(s.pins for s in self.committed.values())
                now = time.monotonic()
                if busy:
                    quiet_since = now
                elif now - quiet_since >= quiet_s:
                    return
                self.cond.wait(0.05)

    def _evict(self) -> None:
        while len(self.committed) > self.keep:
            self._retire(self.committed.pop(min(self.committed)))  # no local keeps it alive here

    def _retire(self, stored: Stored) -> None:
        """Mark ``stored`` evicted (its file goes now unless a reader pins it) and hand the store's
        reference to the reaper thread (started on first use). A reader that still pins it, or
        maps it on the same host, keeps it alive; otherwise the reaper normally holds the last
        reference (this frame lets go of it right after the ``put``), so the unmapping happens
        there, not under the lock of the commit that evicted it."""
        stored.evicted = True
        if stored.pins == 0:
            stored.release()
        if self._reaper is None:
            self._reaper = queue.SimpleQueue()
            threading.Thread(target=_reap, args=(self._reaper,), name="relay-reaper", daemon=True).start()
        self._reaper.put(stored)

    # ------------------------------------------------------------------ reading
    @contextmanager
    def pinned(self, version: int, wait_s: float = 0.0) -> Iterator[Stored]:
        """Pin a committed version (``-1`` = latest) while the caller reads it, waiting up to
        ``wait_s`` for it to arrive; ``WeightError('not_found')`` names the versions held."""
        deadline = time.monotonic() + wait_s
        with self.cond:
            while True:
                want = max(self.committed, default=-1) if version < 0 else version
                if want in self.committed:
                    break
                newest = max(self.committed, default=-1)
                gone = version >= 0 and version < newest and version not in self.incoming
                remaining = deadline - time.monotonic()
                if gone or remaining <= 0:
                    what = "no version" if version < 0 else f"version {version}"
                    why = "evicted or never pushed" if gone else "not here"
                    raise WeightError(
                        "not_found", f"{what} is not held ({why}); versions held: {sorted(self.committed)}"
                    )
                self.cond.wait(min(remaining, 0.5))
            stored = self.committed[want]
            stored.pins += 1
        try:
            yield stored
        finally:
            with self.cond:
                self._unpin(stored)

    def wait_prefix(self, inc: Incoming, index: int, timeout_s: float) -> bool:
        """Wait until chunk ``index`` of an arriving version is in (forwarders); False on timeout
        or when the version was discarded."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while inc.prefix <= index:
                if inc.version in self.committed:
                    return True
                if self.incoming.get(inc.version) is not inc:
                    return False
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.cond.wait(min(remaining, 0.5))
            return True

    def close(self) -> None:
        with self.cond:
            if self._spare is not None:
                self._spare.release()
                self._spare = None
            for s in self.committed.values():
                s.release()
            for inc in self.incoming.values():
                inc.blob.release()
            self.committed.clear()
            self.incoming.clear()
            if self._reaper is not None:
                self._reaper.put(None)


def _reap(q: queue.SimpleQueue) -> None:
    """Let evicted versions go one by one."""
    while True:
        item = q.get()
        if item is None:
            return
        del item  # a version nobody else holds is unmapped (and freed) here, not in a commit
