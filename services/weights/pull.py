"""The receiving half of a relay client (``services.weights.client.RelayClient``): pull a
version, verified, by the fastest path the relay offers.

Shared memory on the same host (map the relay's file, check each chunk's digest); else the raw-TCP
data channel (one grant, one preallocated buffer, a broken stream resumed from its first missing
chunk); else ``streams`` parallel gRPC streams. A corrupted chunk is fetched again alone (a chunk
that fails ``REFETCH_TRIES`` times is an integrity error), and the version digest is checked over
all chunk digests. A caller that holds a version may get the delta from it instead
(``services.weights.delta_blob``), applied to a private copy and checked like a whole version.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

import grpc

from services.common.weights import Chunk, Manifest, WeightError, check_chunk_digest, state_from_blob, version_digest
from services.proto import braid_pb2 as pb
from services.weights import datachan as dc
from services.weights import datapath
from services.weights.convert import manifest_from_pb
from services.weights.delta import DeltaError
from services.weights.delta_blob import Held, materialize
from services.weights.values import Pulled, RelayError
from services.weights.wire import chunk_of

log = logging.getLogger("braid.weights.client")
REFETCH_TRIES = 3
T = TypeVar("T")


def run_parts(parts: int, fn: Callable[[int], T]) -> list[T]:
    """``fn(part)`` for each part 0 .. ``parts`` - 1 at once (part 0 on this thread, the others on
    their own); the results in part order once all have ended, or the lowest part's exception."""
    out: list = [None] * parts
    failed: list[BaseException | None] = [None] * parts

    def run(part: int) -> None:
        try:
            out[part] = fn(part)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            failed[part] = exc

    threads = [threading.Thread(target=run, args=(p,), daemon=True) for p in range(1, parts)]
    for t in threads:
        t.start()
    run(0)
    for t in threads:
        t.join()
    for exc in failed:
        if exc is not None:
            raise exc
    return out


class PullSide:
    """``RelayClient``'s pulls. It provides what they use: ``address``, ``data_path``, ``timeout_s``,
    ``kept`` (kept data connections), ``_host``, ``_pull`` (the Pull call), ``_spare_buf`` (a
    reserved buffer), ``open_transfer``, ``try_data_channel``, ``_dial`` and ``_data_port``."""

    address: str
    data_path: str
    timeout_s: float
    kept: datapath.KeptConnections
    _host: str
    _spare_buf: mmap.mmap | None
    def iter_pull(
        self, version: int = -1, *, from_chunk: int = 0, to_chunk: int = 0, part: int = 0, parts: int = 1,
        allow_shm: bool = False, wait_s: float = 0.0, head_only: bool = False, have: Held | None = None,
    ) -> tuple[pb.WeightManifest, Iterator[Chunk]]:
        """Open a pull stream: (the manifest message, an iterator over the chunks); ``have``: the
        version this caller holds (the relay may send the delta from it)."""
        req = pb.PullRequest(
            version=version, from_chunk=from_chunk, to_chunk=to_chunk, part=part, parts=parts, allow_shm=allow_shm,
            host_id=self._host, wait_s=wait_s, head_only=head_only, **_have_fields(have),
        )
        call = self._pull(req, timeout=self.timeout_s + wait_s)
        try:
            first, _ = next(call)
        except grpc.RpcError as err:
            raise RelayError(err.code(), err.details() or "") from err
        if not first.HasField("manifest"):
            raise RelayError(grpc.StatusCode.INTERNAL, "pull stream did not start with the manifest")

        def chunks() -> Iterator[Chunk]:
            try:
                for msg, data in call:
                    yield chunk_of(msg.chunk, data)
            except grpc.RpcError as err:
                raise RelayError(err.code(), err.details() or "") from err

        return first.manifest, chunks()

    def pull(
        self, version: int = -1, *, streams: int = 1, allow_shm: bool = True, wait_s: float = 0.0,
        specs: dict | None = None, have: Held | None = None,
    ) -> Pulled:
        """Fetch a whole version (``-1`` = latest), verified; ``specs`` (the receiver's parameter
        specs) refuse a different model's parameters. ``have``: the version this caller holds; the
        relay then sends the delta from it when it has one (applied here to a copy, the result's
        digest checked: ``Pulled.delta_bytes``), else the version whole (``Pulled.fallback`` says why)."""
        pulled = self._pull_any(version, streams, allow_shm, wait_s, specs, have)
        if pulled.delta_base is not None:
            try:
                return self._applied(pulled, have)
            except DeltaError as err:  # the buffer is thrown away; the version comes whole instead
                log.warning("delta %d -> %d from relay %s did not apply (%s); pulling it whole", have.version,
                            pulled.version, self.address, err)
                whole = self._pull_any(pulled.version, streams, allow_shm, 0.0, specs, None)
                whole.fallback = f"the delta from version {have.version} did not apply: {err}"
                return whole
        if have is not None and pulled.path != "shm":  # shared memory maps the full version: nothing to save
            pulled.fallback = f"relay {self.address} has no delta from version {have.version} to {pulled.version}"
        return pulled

    def _pull_any(self, version, streams, allow_shm, wait_s, specs, have) -> Pulled:
        """The version, or the delta to it from ``have``, as the relay sends it (not yet applied)."""
        if self.data_path == "tcp" and not allow_shm:  # one round trip: the grant carries manifest and digests
            pulled = self.try_data_channel(self._pull_granted, version, wait_s, specs, have)
            if pulled is not None:
                return pulled
        head, _ = self.iter_pull(version, allow_shm=allow_shm, wait_s=wait_s, head_only=True, have=have)
        m = manifest_from_pb(head)
        if not head.delta:
            _check_specs(head.version, m, specs)
        if head.shm_path:
            pulled = self._pull_shm(head, m)
            if pulled is not None:
                return pulled
        have = have if head.delta else None  # every range of a delta is asked for as the head was
        if self.data_path == "tcp":
            pulled = self.try_data_channel(self._pull_data, head.version, m, head.version_digest, None, have)
            if pulled is not None:
                return pulled
        return self._pull_streams(head.version, m, head.version_digest, streams, have)

    def _applied(self, pulled: Pulled, have: Held) -> Pulled:
        """The version a pulled delta leads to from ``have``: applied to a private copy, checked."""
        buf = datapath.private_buffer(have.manifest.total_bytes)
        view = memoryview(buf)[: have.manifest.total_bytes]
        applied = materialize(have, pulled.manifest, memoryview(pulled.blob)[: pulled.manifest.total_bytes], view)
        if applied.version != pulled.version:
            raise WeightError("integrity", f"relay sent a delta to version {applied.version} for {pulled.version}")
        return Pulled(pulled.version, have.manifest, buf, state_from_blob(have.manifest, view), applied.digest,
                      f"delta+{pulled.path}", pulled.refetched, delta_bytes=pulled.manifest.total_bytes,
                      delta_base=have.version)

    def _pull_shm(self, head: pb.WeightManifest, m: Manifest) -> Pulled | None:
        try:
            fd = os.open(head.shm_path, os.O_RDONLY)
        except FileNotFoundError:  # evicted meanwhile: stream it (or fail naming the versions held)
            return None
        try:
            mm = mmap.mmap(fd, max(m.total_bytes, 1), flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        view = memoryview(mm)[: m.total_bytes]
        digests = list(head.chunk_digests)
        if len(digests) != len(m.plan) or version_digest(digests) != head.version_digest:
            raise WeightError("integrity", f"version {head.version}: chunk digests do not match the version digest")
        bad = [r.index for r in m.plan
               if not check_chunk_digest(view[r.blob_offset : r.blob_offset + r.length], digests[r.index])]
        if not bad:
            return Pulled(head.version, m, mm, state_from_blob(m, view), head.version_digest, "shm")
        copy = bytearray(view)  # a corrupted shared page: patch a private copy from the stream
        self._refetch(head.version, m, copy, digests, bad)
        return Pulled(head.version, m, copy, state_from_blob(m, copy), head.version_digest, "shm", len(bad))

    def _pull_granted(self, version: int, wait_s: float, specs: dict | None, have: Held | None) -> Pulled:
        grant = self.open_transfer(pb.TransferRequest(direction="pull", version=version, wait_s=wait_s,
                                                      **_have_fields(have)))
        m = manifest_from_pb(grant.manifest)
        if not grant.manifest.delta:
            _check_specs(grant.version, m, specs)
        return self._pull_data(grant.version, m, grant.manifest.version_digest, grant,
                               have if grant.manifest.delta else None)

    def _pull_data(self, version: int, m: Manifest, vdigest: str, grant: pb.TransferGrant | None = None,
                   have: Held | None = None) -> Pulled:
        """Pull over the data channel into one preallocated buffer; resume a broken stream from
        the first missing chunk, re-fetch corrupted chunks alone. ``grant``: a whole-version
        grant already opened; ``have``: the pull is of the delta from that version."""
        buf = None
        if have is None:  # the reserved buffer is for a whole version
            buf, self._spare_buf = self._spare_buf, None
        prefaulted = buf is not None and len(buf) == max(m.total_bytes, 1)
        if not prefaulted:
            buf = datapath.private_buffer(m.total_bytes)
        view = memoryview(buf)[: m.total_bytes]
        n = len(m.plan)
        got, refetched, breaks = [False] * n, 0, 0
        while (start := datapath.first_missing(got)) < n:
            bad: list[int] = []
            try:
                self._receive_range(version, m, view, vdigest, start, n, got, bad, grant if start == 0 else None, have)
                grant = None
            except RelayError as err:
                grant = None
                if err.code != grpc.StatusCode.UNAVAILABLE or breaks >= REFETCH_TRIES:
                    raise
                breaks += 1
                log.warning("pull of version %d broke (%s); resuming from chunk %d", version, err,
                            datapath.first_missing(got, start))
            for index in bad:  # corrupted in transit: fetch it again alone
                for _ in range(REFETCH_TRIES):
                    self._receive_range(version, m, view, vdigest, index, index + 1, got, [], None, have)
                    if got[index]:
                        break
                else:
                    raise WeightError(
                        "integrity",
                        f"chunk {index} of version {version} corrupted on every one of {REFETCH_TRIES} tries",
                    )
            refetched += len(bad)
        return _pulled(version, m, buf, view, vdigest, "tcp", refetched, have, prefaulted)

    def _receive_range(self, version, m, view, vdigest, start, stop, got, bad, grant=None, have=None) -> None:
        if grant is None:
            grant = self.open_transfer(pb.TransferRequest(direction="pull", version=version, from_chunk=start,
                                                          to_chunk=stop, **_have_fields(have)))
        digests = list(grant.manifest.chunk_digests)
        if grant.version != version or len(digests) != len(m.plan) or grant.manifest.version_digest != vdigest \
                or version_digest(digests) != vdigest:
            raise WeightError(
                "integrity", f"version {version}: the grant's chunk digests do not match the version digest"
            )
        sock, _ = self._dial(grant, dc.PULL)  # a kept one found closed breaks the pull: it resumes on a fresh one
        datapath.receive_version(sock, m, view, digests, vdigest, start, stop, got, bad)  # closes it unless complete
        self.kept.give(self._data_port(grant), sock)

    def _pull_streams(self, version: int, m: Manifest, vdigest: str, streams: int, have: Held | None) -> Pulled:
        buf = mmap.mmap(-1, max(m.total_bytes, 1))
        view = memoryview(buf)[: m.total_bytes]
        digests: list[str] = [""] * len(m.plan)
        bad: list[int] = []
        parts = max(1, min(streams, len(m.plan)))

        def run(part: int) -> None:
            _, chunks = self.iter_pull(version, part=part, parts=parts, have=have)
            for c in chunks:
                self._place(m, view, c, digests, bad)

        run_parts(parts, run)
        refetched = len(bad)
        if bad:
            self._refetch(version, m, view, digests, bad, have)
        missing = [i for i, d in enumerate(digests) if not d]
        if missing:
            raise WeightError("argument", f"version {version}: chunks {missing[:5]} never arrived")
        if version_digest(digests) != vdigest:
            raise WeightError("integrity", f"version digest mismatch for version {version}")
        return _pulled(version, m, buf, view, vdigest, "stream", refetched, have)

    @staticmethod
    def _place(m: Manifest, view, c: Chunk, digests: list[str], bad: list[int]) -> None:
        if not 0 <= c.index < len(m.plan):
            raise WeightError("argument", f"relay sent chunk index {c.index} outside the plan")
        ref = m.plan[c.index]
        if c.name != ref.name or c.offset != ref.tensor_offset or len(c.data) != ref.length:
            raise WeightError("argument", f"relay sent chunk {c.index} that does not match the manifest")
        if not check_chunk_digest(c.data, c.chunk_digest):
            bad.append(c.index)
            return
        view[ref.blob_offset : ref.blob_offset + ref.length] = c.data
        digests[c.index] = c.chunk_digest

    def _refetch(self, version: int, m: Manifest, view, digests: list[str], bad: list[int],
                 have: Held | None = None) -> None:
        """Fetch corrupted chunks again, one at a time (a chunk failing every try is DATA_LOSS)."""
        for index in sorted(set(bad)):
            for _ in range(REFETCH_TRIES):
                still: list[int] = []
                _, chunks = self.iter_pull(version, from_chunk=index, to_chunk=index + 1, have=have)
                for c in chunks:
                    self._place(m, view, c, digests, still)
                if not still and digests[index]:
                    break
            else:
                raise WeightError(
                    "integrity", f"chunk {index} of version {version} corrupted on every one of {REFETCH_TRIES} tries"
                )

def _have_fields(have: Held | None) -> dict:
    """The request fields that ask for the delta from a held version."""
    return {} if have is None else {"delta_ok": True, "have_version": have.version, "have_digest": have.digest}


def _pulled(version, m, buf, view, vdigest, path, refetched, have, prefaulted=False) -> Pulled:
    """What a network pull received: the version (tensors viewing it), or the delta from ``have``."""
    state = {} if have is not None else state_from_blob(m, view)
    return Pulled(version, m, buf, state, vdigest, path, refetched, prefaulted,
                  delta_base=None if have is None else have.version)


def _check_specs(version: int, m: Manifest, specs: dict | None) -> None:
    m.validate()
    if specs is not None and m.specs() != specs:
        diff = sorted(set(m.specs().items()) ^ set(specs.items()))[:3]
        raise WeightError(
            "argument", f"version {version} is a different model's parameters (first differences: {diff})"
        )
