"""A delta between two whole versions of one model: the version frame, and the frames of every
tensor in the manifest's order (``services.weights.delta`` codes each tensor).

The version frame names the base and new versions, their version digests as the full push
computes them (SHA-256 over the chunk digests of the manifest's plan), the chunk digest algorithm,
``chunk_bytes`` and the manifest's fingerprint. ``apply_version`` refuses a delta whose base is not
the held version (``DeltaBaseMismatch``: another version number or digest) before anything else,
then decodes and checks every tensor frame before writing any (a truncated or mismatched delta
leaves the base untouched), writes them all, and computes the version digest of the result as the
full push does. If it differs (``DeltaDigestMismatch``) the base buffer holds neither version: the
caller must discard it and take a full version. Memory: the decoded delta (indices as int64,
values) is held at once.

``compose`` makes one delta out of a chain of them (a relay serving a puller several versions
behind): the union of the positions each step changed, with the newest version's values there.

Pure: no I/O, no torch.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from services.common.weights import DIGEST_ALGOS, Manifest, chunk_digest, version_digest
from services.weights import delta_values as V
from services.weights.delta import (
    FORMAT,
    KIND_VERSION,
    MAGIC,
    DeltaBaseMismatch,
    DeltaDigestMismatch,
    DeltaError,
    Plan,
    check_magic,
    decode,
    encode,
    encode_positions,
    itemsize_of,
    plan_of,
    positions_of,
    view_of,
    write_plan,
)

# magic, format, kind, base version, version, chunk_bytes, tensors
_VERSION = struct.Struct("<4sBBqqQI")


@dataclass(frozen=True)
class DeltaHeader:
    """The version frame: which version the delta leads from and to, and how to check the result."""

    base_version: int
    version: int
    chunk_bytes: int
    tensors: int
    algo: str  # chunk digest algorithm of both digests
    base_digest: str
    digest: str
    fingerprint: str  # ``Manifest.fingerprint()``: names, dtypes and shapes


@dataclass(frozen=True)
class Applied:
    """What ``apply_version`` made of the base buffer."""

    version: int
    digest: str
    chunk_digests: tuple[str, ...]
    changed: int  # elements changed over all tensors
    delta_bytes: int  # bytes of all frames


def _pack_str(s: str) -> bytes:
    b = s.encode()
    if len(b) > 0xFFFF:
        raise DeltaError(f"a {len(b)}-byte string does not fit a delta header")
    return struct.pack("<H", len(b)) + b


def encode_header(h: DeltaHeader) -> bytes:
    """The version frame."""
    fixed = _VERSION.pack(MAGIC, FORMAT, KIND_VERSION, h.base_version, h.version, h.chunk_bytes, h.tensors)
    return fixed + b"".join(_pack_str(s) for s in (h.algo, h.base_digest, h.digest, h.fingerprint))


def decode_header(frame) -> DeltaHeader:
    """Parse and check the version frame."""
    mv = view_of(frame, "version frame")
    check_magic(mv, KIND_VERSION, "version", _VERSION.size)
    _, _, _, base_version, version, chunk_bytes, tensors = _VERSION.unpack_from(mv)
    pos, strings = _VERSION.size, []
    for _ in range(4):
        n = struct.unpack_from("<H", mv, pos)[0] if pos + 2 <= len(mv) else -1
        if n < 0 or pos + 2 + n > len(mv):
            raise DeltaError(f"version frame truncated at byte {pos} of {len(mv)}")
        try:
            strings.append(bytes(mv[pos + 2 : pos + 2 + n]).decode())
        except UnicodeDecodeError:
            raise DeltaError(f"version frame: the string at byte {pos} is not UTF-8") from None
        pos += 2 + n
    if pos != len(mv):
        raise DeltaError(f"version frame has {len(mv) - pos} bytes after its header")
    algo, base_digest, digest, fingerprint = strings
    if algo not in DIGEST_ALGOS:
        raise DeltaError(f"version frame names chunk digest {algo!r}, not one of {list(DIGEST_ALGOS)}")
    return DeltaHeader(base_version, version, chunk_bytes, tensors, algo, base_digest, digest, fingerprint)


def version_digests(manifest: Manifest, view, algo: str = "xxh3_128") -> tuple[list[str], str]:
    """The chunk digests and version digest of a version's blob: what the full push sends."""
    mv = view_of(view, "version blob")
    chunks = [chunk_digest(mv[r.blob_offset : r.blob_offset + r.length], algo) for r in manifest.plan]
    return chunks, version_digest(chunks)


def _blob_view(blob, manifest: Manifest, what: str) -> memoryview:
    mv = view_of(blob, what)
    if len(mv) != manifest.total_bytes:
        raise DeltaError(f"{what} has {len(mv)} bytes, the manifest {manifest.total_bytes}")
    return mv


def encode_version(
    manifest: Manifest, prev, new, *, base_version: int, version: int, base_digest: str, digest: str,
    algo: str = "xxh3_128", level: int = 1, workers: int = 0,
) -> list[bytes]:
    """The frames of the delta from ``prev`` (the base version's blob) to ``new`` (the new version's
    blob), both laid out by ``manifest``; the digests are the versions' as the full push has them.
    Tensors are encoded on ``workers`` threads (0: up to 4, one per core; zlib and numpy's large
    operations release the GIL)."""
    manifest.validate()
    if version <= base_version:
        raise DeltaError(f"a delta leads to a newer version: {base_version} -> {version}")
    a, b = _blob_view(prev, manifest, "previous version"), _blob_view(new, manifest, "new version")
    header = DeltaHeader(base_version, version, manifest.chunk_bytes, len(manifest.tensors), algo, base_digest,
                         digest, manifest.fingerprint())

    def one(i: int) -> bytes:
        t = manifest.tensors[i]
        span = slice(t.offset, t.offset + t.nbytes)
        return encode(a[span], b[span], itemsize_of(t.dtype), index=i, name=t.name, level=level)

    with ThreadPoolExecutor(workers or min(4, os.cpu_count() or 1), thread_name_prefix="delta-encode") as pool:
        return [encode_header(header), *pool.map(one, range(len(manifest.tensors)))]


def check_base(header: DeltaHeader, manifest: Manifest, held_version: int, held_digest: str) -> None:
    """Refuse a delta that does not lead from the held version of this model."""
    if header.base_version != held_version or header.base_digest != held_digest:
        raise DeltaBaseMismatch(
            f"delta {header.base_version} -> {header.version} (base digest {header.base_digest[:23]}) does not "
            f"apply to the held version {held_version} (digest {held_digest[:23]}): take a full version")
    if header.fingerprint != manifest.fingerprint() or header.chunk_bytes != manifest.chunk_bytes:
        raise DeltaError(
            f"delta for model {header.fingerprint} in {header.chunk_bytes}-byte chunks; the held version is "
            f"{manifest.fingerprint()} in {manifest.chunk_bytes}-byte chunks")
    if header.tensors != len(manifest.tensors):
        raise DeltaError(f"delta has {header.tensors} tensors, the manifest {len(manifest.tensors)}")


def _checked_plans(manifest: Manifest, frames: Sequence) -> list[Plan]:
    """Decode every tensor frame against its manifest entry (in order, each once), on up to 4 threads."""
    if len(frames) != len(manifest.tensors):
        raise DeltaError(f"{len(frames)} tensor frames for {len(manifest.tensors)} tensors")

    def one(i: int) -> Plan:
        t, d = manifest.tensors[i], decode(frames[i])
        size = itemsize_of(t.dtype)
        if d.index != i or d.name != t.name or d.itemsize != size or d.count * size != t.nbytes:
            raise DeltaError(f"tensor frame {i} is for {d.name!r} (index {d.index}, {d.count} x {d.itemsize} "
                             f"bytes); the manifest has {t.name!r} ({t.nbytes} bytes of {t.dtype}) there")
        return plan_of(d)

    with ThreadPoolExecutor(min(4, os.cpu_count() or 1), thread_name_prefix="delta-decode") as pool:
        return list(pool.map(one, range(len(frames))))


def apply_version(manifest: Manifest, base, frames: Sequence, *, held_version: int, held_digest: str) -> Applied:
    """Turn ``base`` (a writable buffer holding version ``held_version`` with digest ``held_digest``,
    laid out by ``manifest``) into the delta's new version in place, and check its digest."""
    if not frames:
        raise DeltaError("empty delta: no version frame")
    header = decode_header(frames[0])
    check_base(header, manifest, held_version, held_digest)
    if len(frames) - 1 != header.tensors:
        raise DeltaError(f"delta {header.base_version} -> {header.version} has {len(frames) - 1} tensor frames "
                         f"of {header.tensors} (truncated or overlong)")
    view = _blob_view(base, manifest, "base buffer")
    if view.readonly:
        raise DeltaError("the base buffer is read-only")
    plans = _checked_plans(manifest, frames[1:])
    for t, plan in zip(manifest.tensors, plans, strict=True):
        if t.nbytes:
            write_plan(np.frombuffer(view[t.offset : t.offset + t.nbytes], dtype=V.UINT[itemsize_of(t.dtype)]), plan)
    chunks, digest = version_digests(manifest, view, header.algo)
    if digest != header.digest:
        raise DeltaDigestMismatch(
            f"delta {header.base_version} -> {header.version} gave digest {digest[:23]}, the publisher's is "
            f"{header.digest[:23]}: the buffer holds neither version; take a full version")
    return Applied(header.version, digest, tuple(chunks), sum(p.changed for p in plans), sum(len(f) for f in frames))


def _check_chain(manifest: Manifest, chain: Sequence[Sequence]) -> list[DeltaHeader]:
    """The version frames of a chain of deltas of this model, each leading on from the one before."""
    if not chain:
        raise DeltaError("an empty chain of deltas")
    headers = []
    for frames in chain:
        h = decode_header(frames[0])
        if h.fingerprint != manifest.fingerprint() or h.chunk_bytes != manifest.chunk_bytes \
                or h.tensors != len(manifest.tensors) or len(frames) - 1 != h.tensors:
            raise DeltaError(f"delta {h.base_version} -> {h.version} is not a whole delta of this model")
        if headers and (h.base_version, h.base_digest) != (headers[-1].version, headers[-1].digest):
            raise DeltaError(f"deltas {headers[-1].base_version} -> {headers[-1].version} and {h.base_version} -> "
                             f"{h.version} do not follow on")
        headers.append(h)
    return headers


def compose(manifest: Manifest, new, chain: Sequence[Sequence], *, level: int = 1, workers: int = 0) -> list[bytes]:
    """One delta with the effect of applying ``chain``'s deltas (each a list of frames, oldest first,
    each leading on from the one before) in turn: per tensor the union of the positions any step
    changed, with ``new``'s values there (``new``: the last version's blob, laid out by ``manifest``;
    its digest is the last delta's). Checked against the model; the result is checked when applied."""
    headers = _check_chain(manifest, chain)
    view = _blob_view(new, manifest, "new version")
    first, last = headers[0], headers[-1]
    header = DeltaHeader(first.base_version, last.version, manifest.chunk_bytes, len(manifest.tensors), last.algo,
                         first.base_digest, last.digest, manifest.fingerprint())

    def one(i: int) -> bytes:
        t = manifest.tensors[i]
        decoded = [decode(frames[i + 1]) for frames in chain]
        for d in decoded:
            if d.index != i or d.name != t.name or d.count * d.itemsize != t.nbytes:
                raise DeltaError(f"tensor frame {i} of a delta is for {d.name!r}; the manifest has {t.name!r} there")
        sets = [positions_of(d) for d in decoded]
        pos = None if any(p is None for p in sets) else np.unique(np.concatenate(sets)).astype(np.int64)
        return encode_positions(view[t.offset : t.offset + t.nbytes], pos, itemsize_of(t.dtype), index=i,
                                name=t.name, level=level)

    with ThreadPoolExecutor(workers or min(4, os.cpu_count() or 1), thread_name_prefix="delta-compose") as pool:
        return [encode_header(header), *pool.map(one, range(len(manifest.tensors)))]
