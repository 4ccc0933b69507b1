"""Delta weight versions: only the elements that changed since the previous version cross the link.

A version is a ``Manifest`` of tensors back to back in one blob (``services.common.weights``). A
delta from version ``b`` to version ``v`` of the same model, in the dtype the SGS serves, is a list
of frames: one *version frame*, then one *tensor frame* per tensor of the manifest, in its order.
Everything works on raw bytes: an element is ``itemsize`` bytes (2 for bfloat16/float16, 4 for
float32, from the manifest's dtype) compared bit for bit, so ``-0.0`` vs ``0.0`` or a NaN payload
counts as a change and the applied result is bit-identical to the new version.

Each frame starts with ``MAGIC``, ``FORMAT`` and its kind (fields: ``_VERSION``, ``_TENSOR``). The
version frame names the base and new versions, their version digests as the full push computes
them (SHA-256 over the chunk digests of the manifest's plan), the chunk digest algorithm,
``chunk_bytes`` and the manifest's fingerprint. A tensor frame carries the tensor's index and name,
element size and count, the changed count, the mode and codec, the payload's size inflated and as
sent, and an xxh3_64 of the payload. The payload is an index section, then the new values of the
changed elements in index order, byte plane by byte plane (a float's exponent bytes sit together,
which is what makes them deflate). Per tensor the encoder takes the smallest raw payload of:

- ``gaps``: LEB128 varints of the gaps between changed indices (the first index, then
  ``index[i] - index[i-1] - 1``): about one byte per change when changes are dense enough;
- ``bitmap``: one bit per element (``ceil(count / 8)`` bytes), for changes too dense for gaps;
- ``whole``: the tensor's new bytes, no index, when more than ``1 - 1 / (8 * itemsize)`` of it
  changed (94% for bfloat16, 97% for float32): from there a bitmap costs more than it saves.

The payload is then deflated (zlib, level ``level``) and kept so only when that saves
``COMPRESS_MIN_GAIN``; the lock has no zstd or lz4.

Checks, and what a refusal leaves behind:

- ``apply`` (one tensor) parses and checks the whole frame (lengths, checksum, mode, inflated size,
  every index in range, bitmap padding, base size and writability) before it writes a byte: a
  refused frame leaves the base untouched. Every refusal is a ``DeltaError`` (a ``WeightError``,
  so the gRPC edge maps its kind); nothing raises ``IndexError`` or ``struct.error``.
- ``apply_version`` refuses a delta whose base is not the held version (``DeltaBaseMismatch``:
  another version number or digest) before anything else, then decodes and checks every tensor
  frame before writing any (a truncated or mismatched delta leaves the base untouched), writes
  them all, and computes the version digest of the result as the full push does. If it differs
  (``DeltaDigestMismatch``) the base buffer holds neither version: the caller must discard it and
  take a full version. Memory: the decoded delta (indices as int64, values) is held at once.

Pure: no I/O, no torch.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import xxhash

from services.common.weights import DIGEST_ALGOS, Manifest, TensorSpec, WeightError, chunk_digest, version_digest

FORMAT = 1
MAGIC = b"BRDD"
_KIND_VERSION, _KIND_TENSOR = 1, 2
Mode = Literal["gaps", "bitmap", "whole"]
MODES: tuple[Mode, ...] = ("gaps", "bitmap", "whole")
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
COMPRESS_MIN_GAIN = 0.02  # deflated output kept only if it saves this share: inflating costs the receiver CPU
COMPRESS_MIN_BYTES = 256  # below this zlib's own framing eats the gain
_MAX_VARINT = 10  # bytes of a LEB128 uint64

# magic, format, kind, mode, codec, itemsize, index, count, changed, raw bytes, payload bytes, xxh3_64, name length
_TENSOR = struct.Struct("<4sBBBBBIQQQQQH")
# magic, format, kind, base version, version, chunk_bytes, tensors
_VERSION = struct.Struct("<4sBBqqQI")


class DeltaError(WeightError):
    """A delta is malformed, truncated, or does not fit what it is applied to (kind ``argument``
    unless a subclass says otherwise)."""

    def __init__(self, message: str, kind: str = "argument") -> None:
        super().__init__(kind, message)


class DeltaBaseMismatch(DeltaError):
    """The delta was computed from another version than the one held: take a full version."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "precondition")


class DeltaDigestMismatch(DeltaError):
    """The applied result's digest is not the publisher's: the buffer holds neither version."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "integrity")


@dataclass(frozen=True)
class TensorDelta:
    """One tensor frame, its header checked and its payload checksummed (not yet inflated)."""

    index: int
    name: str
    itemsize: int
    count: int  # elements in the tensor
    changed: int  # elements that differ from the base (all of them are written in ``whole`` mode)
    mode: Mode
    compressed: bool
    raw_bytes: int  # the payload's size inflated
    payload: bytes | memoryview
    frame_bytes: int


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


@dataclass(frozen=True)
class _Plan:
    """A decoded, checked tensor delta: the positions to write (None: the whole tensor) and values."""

    positions: np.ndarray | None
    values: np.ndarray
    changed: int


def itemsize_of(dtype: str) -> int:
    """Bytes per element of a manifest dtype name."""
    return TensorSpec(dtype, ()).nbytes


# ---------------------------------------------------------------------------------------------- varints
def _varint_lengths(values: np.ndarray) -> np.ndarray:
    """Bytes of each value's LEB128 encoding (values: uint64)."""
    lengths = np.ones(len(values), dtype=np.int64)
    for j in range(1, _MAX_VARINT):
        lengths += values >= np.uint64(1 << (7 * j))
    return lengths


def _encode_varints(values: np.ndarray) -> bytes:
    """LEB128 of every value (uint64), back to back, built a byte position at a time."""
    values = values.astype(np.uint64, copy=False)
    lengths = _varint_lengths(values)
    out = np.empty(int(lengths.sum()), dtype=np.uint8)
    starts = np.cumsum(lengths) - lengths
    for j in range(int(lengths.max(initial=0))):
        has = lengths > j
        byte = (values[has] >> np.uint64(7 * j)) & np.uint64(0x7F)
        more = (lengths[has] > j + 1).astype(np.uint64) << np.uint64(7)
        out[starts[has] + j] = (byte | more).astype(np.uint8)
    return out.tobytes()


def _decode_varints(buf: np.ndarray, n: int, max_len: int) -> np.ndarray:
    """Exactly ``n`` LEB128 values of at most ``max_len`` bytes each filling ``buf`` (uint8)."""
    if n == 0:
        if len(buf):
            raise DeltaError(f"{len(buf)} index bytes for no changed element")
        return np.zeros(0, dtype=np.uint64)
    ends = np.flatnonzero((buf & 0x80) == 0)
    if len(ends) != n or ends[-1] != len(buf) - 1:
        raise DeltaError(f"index section holds {len(ends)} complete varints (last ends at byte "
                         f"{ends[-1] + 1 if len(ends) else 0} of {len(buf)}), expected {n}")
    starts = np.empty(n, dtype=np.int64)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    if int(lengths.max()) > max_len:
        raise DeltaError(f"an index gap of {int(lengths.max())} varint bytes: longer than the tensor allows")
    shift = (np.arange(len(buf), dtype=np.int64) - np.repeat(starts, lengths)) * 7
    parts = (buf & 0x7F).astype(np.uint64) << shift.astype(np.uint64)
    return np.bitwise_or.reduceat(parts, starts)


# ------------------------------------------------------------------------------------------ one tensor
def _bytes(buf, what: str) -> memoryview:
    """``buf`` as a flat byte view; refused when it is not a contiguous buffer."""
    try:
        return memoryview(buf).cast("B")
    except TypeError as err:
        raise DeltaError(f"{what} is not a contiguous byte buffer: {err}") from None


def _elements(buf, itemsize: int, what: str) -> np.ndarray:
    if itemsize not in _UINT:
        raise DeltaError(f"element size {itemsize} is not one of {sorted(_UINT)}")
    mv = _bytes(buf, what)
    if len(mv) % itemsize:
        raise DeltaError(f"{what} has {len(mv)} bytes, not a whole number of {itemsize}-byte elements")
    return np.frombuffer(mv, dtype=_UINT[itemsize])


def changed_positions(prev, new, itemsize: int) -> np.ndarray:
    """Indices (int64, ascending) of the elements whose bytes differ between two images of a tensor."""
    a, b = _elements(prev, itemsize, "previous tensor"), _elements(new, itemsize, "new tensor")
    if len(a) != len(b):
        raise DeltaError(f"previous tensor has {len(a)} elements, the new one {len(b)}")
    return np.flatnonzero(a != b)


def choose_mode(count: int, changed: int, gap_bytes: int, itemsize: int) -> Mode:
    """The mode with the smallest raw payload (ties: the cheaper one to apply, ``whole`` first)."""
    sizes = {"whole": count * itemsize, "bitmap": -(-count // 8) + changed * itemsize,
             "gaps": gap_bytes + changed * itemsize}
    return min(("whole", "bitmap", "gaps"), key=lambda m: sizes[m])  # type: ignore[return-value]


def _planes(values: np.ndarray, itemsize: int) -> bytes:
    """Values' bytes byte plane by byte plane."""
    return values.view(np.uint8).reshape(len(values), itemsize).T.tobytes()


def _unplanes(raw: np.ndarray, itemsize: int) -> np.ndarray:
    n = len(raw) // itemsize
    return np.ascontiguousarray(raw.reshape(itemsize, n).T).view(_UINT[itemsize]).reshape(n)


def encode(prev, new, itemsize: int, *, index: int = 0, name: str = "", level: int = 1) -> bytes:
    """The tensor frame turning ``prev`` (bytes of the base's tensor) into ``new``; ``level``: zlib
    level (0: never deflate)."""
    name_b = name.encode()
    if len(name_b) > 0xFFFF or not 0 <= index < 1 << 32:
        raise DeltaError(f"tensor name of {len(name_b)} bytes or index {index} does not fit a frame")
    new_el = _elements(new, itemsize, "new tensor")
    pos = changed_positions(prev, new, itemsize)
    count, changed = len(new_el), len(pos)
    gaps_u = (np.diff(pos, prepend=-1) - 1).astype(np.uint64)
    mode = choose_mode(count, changed, int(_varint_lengths(gaps_u).sum()), itemsize)
    if mode == "whole":
        raw = _planes(new_el, itemsize)
    else:
        if mode == "gaps":
            head = _encode_varints(gaps_u)
        else:
            mask = np.zeros(count, dtype=bool)
            mask[pos] = True
            head = np.packbits(mask, bitorder="little").tobytes()
        raw = head + _planes(new_el[pos], itemsize)
    payload, codec = raw, 0
    if level > 0 and len(raw) >= COMPRESS_MIN_BYTES:
        packed = zlib.compress(raw, level)
        if len(packed) <= len(raw) * (1 - COMPRESS_MIN_GAIN):
            payload, codec = packed, 1
    head = _TENSOR.pack(MAGIC, FORMAT, _KIND_TENSOR, MODES.index(mode), codec, itemsize, index, count, changed,
                        len(raw), len(payload), xxhash.xxh3_64_intdigest(payload), len(name_b))
    return b"".join((head, name_b, payload))


def _check_magic(mv: memoryview, kind: int, what: str, header: int) -> None:
    if mv[:4] != MAGIC or len(mv) < 6:
        raise DeltaError(f"not a delta frame (starts {bytes(mv[:6])!r}, expected {MAGIC!r}, format, kind)")
    _, fmt, got = struct.unpack_from("<4sBB", mv)
    if fmt != FORMAT:
        raise DeltaError(f"delta frame format {fmt}; this reader knows format {FORMAT}")
    if got != kind:
        raise DeltaError(f"frame of kind {got} where a {what} frame (kind {kind}) was expected")
    if len(mv) < header:
        raise DeltaError(f"{what} frame of {len(mv)} bytes: shorter than its {header}-byte header")


def decode(frame) -> TensorDelta:
    """Parse a tensor frame's header and check its length and payload checksum."""
    mv = _bytes(frame, "tensor frame")
    _check_magic(mv, _KIND_TENSOR, "tensor", _TENSOR.size)
    _, _, _, mode, codec, itemsize, index, count, changed, raw, size, check, name_len = _TENSOR.unpack_from(mv)
    want = _TENSOR.size + name_len + size
    if len(mv) != want:
        raise DeltaError(f"tensor frame {index} has {len(mv)} bytes, its header says {want} (truncated or overlong)")
    if mode >= len(MODES) or codec > 1 or itemsize not in _UINT:
        raise DeltaError(f"tensor frame {index}: unknown mode {mode}, codec {codec} or element size {itemsize}")
    if changed > count:
        raise DeltaError(f"tensor frame {index}: {changed} changed elements of {count}")
    payload = mv[_TENSOR.size + name_len :]
    if xxhash.xxh3_64_intdigest(payload) != check:
        raise DeltaError(f"tensor frame {index}: payload checksum mismatch (corrupted in transit)", "integrity")
    try:
        name = bytes(mv[_TENSOR.size : _TENSOR.size + name_len]).decode()
    except UnicodeDecodeError:
        raise DeltaError(f"tensor frame {index}: its name is not UTF-8") from None
    return TensorDelta(index, name, itemsize, count, changed, MODES[mode], codec == 1, raw, payload, len(mv))


def _inflate(d: TensorDelta) -> np.ndarray:
    if not d.compressed:
        if len(d.payload) != d.raw_bytes:
            raise DeltaError(f"tensor {d.name!r}: {len(d.payload)} payload bytes, its header says {d.raw_bytes}")
        return np.frombuffer(d.payload, dtype=np.uint8)
    z = zlib.decompressobj()
    try:
        raw = z.decompress(d.payload, d.raw_bytes + 1)  # one byte more than promised reveals an overlong stream
    except zlib.error as err:
        raise DeltaError(f"tensor {d.name!r}: payload does not inflate: {err}") from None
    if len(raw) != d.raw_bytes or not z.eof or z.unused_data:
        raise DeltaError(f"tensor {d.name!r}: payload inflates to {len(raw)}{'' if z.eof else '+ (unfinished)'} "
                         f"bytes, its header says {d.raw_bytes}")
    return np.frombuffer(raw, dtype=np.uint8)


def _index_bytes(d: TensorDelta) -> int:
    """Size of the index section the mode implies; raises when the payload size cannot be right."""
    values = d.count * d.itemsize if d.mode == "whole" else d.changed * d.itemsize
    head = {"whole": 0, "bitmap": -(-d.count // 8), "gaps": d.raw_bytes - values}[d.mode]
    if d.raw_bytes != head + values or (d.mode == "gaps" and not d.changed <= head <= d.changed * _MAX_VARINT):
        raise DeltaError(f"tensor {d.name!r}: {d.raw_bytes} payload bytes cannot hold {d.changed} of {d.count} "
                         f"elements in mode {d.mode}")
    return head


def _plan(d: TensorDelta) -> _Plan:
    """Inflate and check a tensor delta completely: every position in range, values of the right size."""
    head = _index_bytes(d)
    raw = _inflate(d)
    values = _unplanes(raw[head:], d.itemsize)
    if d.mode == "whole":
        return _Plan(None, values, d.changed)
    if d.mode == "bitmap":
        bits = np.unpackbits(raw[:head], bitorder="little")
        if bits[d.count :].any():
            raise DeltaError(f"tensor {d.name!r}: bitmap bits set past its {d.count} elements")
        pos = np.flatnonzero(bits[: d.count])
    else:
        gaps = _decode_varints(raw[:head], d.changed, int(_varint_lengths(np.array([d.count], np.uint64))[0]))
        if d.changed and int(gaps.max()) >= d.count:
            raise DeltaError(f"tensor {d.name!r}: index gap {int(gaps.max())} out of range ({d.count} elements)")
        pos = (np.cumsum(gaps + np.uint64(1)) - np.uint64(1)).astype(np.int64)
    if len(pos) != d.changed or (len(pos) and int(pos[-1]) >= d.count):
        last = int(pos[-1]) if len(pos) else -1
        raise DeltaError(f"tensor {d.name!r}: {len(pos)} positions (last {last}) for {d.changed} changed "
                         f"elements of {d.count}: index out of range")
    return _Plan(pos, values, d.changed)


def _target(base, d: TensorDelta) -> np.ndarray:
    mv = _bytes(base, f"the base of tensor {d.name!r}")
    if mv.readonly:
        raise DeltaError(f"tensor {d.name!r}: the base buffer is read-only")
    if len(mv) != d.count * d.itemsize:
        raise DeltaError(f"tensor {d.name!r}: base of {len(mv)} bytes, the delta is for "
                         f"{d.count} x {d.itemsize} = {d.count * d.itemsize}")
    return np.frombuffer(mv, dtype=_UINT[d.itemsize])


def _write(target: np.ndarray, plan: _Plan) -> None:
    if plan.positions is None:
        target[:] = plan.values
    else:
        target[plan.positions] = plan.values


def apply(base, delta) -> int:
    """Apply one tensor frame (bytes, or a ``decode``d one) to ``base`` (a writable buffer holding the
    base's bytes of that tensor) in place; returns the number of changed elements. Everything is
    checked before the first byte is written: a refused delta leaves ``base`` as it was."""
    d = delta if isinstance(delta, TensorDelta) else decode(delta)
    target = _target(base, d)
    _write(target, _plan(d))
    return d.changed


# ---------------------------------------------------------------------------------------- one version
def _pack_str(s: str) -> bytes:
    b = s.encode()
    if len(b) > 0xFFFF:
        raise DeltaError(f"a {len(b)}-byte string does not fit a delta header")
    return struct.pack("<H", len(b)) + b


def encode_header(h: DeltaHeader) -> bytes:
    """The version frame."""
    fixed = _VERSION.pack(MAGIC, FORMAT, _KIND_VERSION, h.base_version, h.version, h.chunk_bytes, h.tensors)
    return fixed + b"".join(_pack_str(s) for s in (h.algo, h.base_digest, h.digest, h.fingerprint))


def decode_header(frame) -> DeltaHeader:
    """Parse and check the version frame."""
    mv = _bytes(frame, "version frame")
    _check_magic(mv, _KIND_VERSION, "version", _VERSION.size)
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
    mv = _bytes(view, "version blob")
    chunks = [chunk_digest(mv[r.blob_offset : r.blob_offset + r.length], algo) for r in manifest.plan]
    return chunks, version_digest(chunks)


def _blob_view(blob, manifest: Manifest, what: str) -> memoryview:
    mv = _bytes(blob, what)
    if len(mv) != manifest.total_bytes:
        raise DeltaError(f"{what} has {len(mv)} bytes, the manifest {manifest.total_bytes}")
    return mv


def encode_version(
    manifest: Manifest, prev, new, *, base_version: int, version: int, base_digest: str, digest: str,
    algo: str = "xxh3_128", level: int = 1,
) -> list[bytes]:
    """The frames of the delta from ``prev`` (the base version's blob) to ``new`` (the new version's
    blob), both laid out by ``manifest``; the digests are the versions' as the full push has them."""
    manifest.validate()
    if version <= base_version:
        raise DeltaError(f"a delta leads to a newer version: {base_version} -> {version}")
    a, b = _blob_view(prev, manifest, "previous version"), _blob_view(new, manifest, "new version")
    header = DeltaHeader(base_version, version, manifest.chunk_bytes, len(manifest.tensors), algo, base_digest,
                         digest, manifest.fingerprint())
    frames = [encode_header(header)]
    for i, t in enumerate(manifest.tensors):
        span = slice(t.offset, t.offset + t.nbytes)
        frames.append(encode(a[span], b[span], itemsize_of(t.dtype), index=i, name=t.name, level=level))
    return frames


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


def _checked_plans(manifest: Manifest, frames: Sequence) -> list[_Plan]:
    """Decode every tensor frame against its manifest entry (in order, each once)."""
    plans = []
    for i, (t, frame) in enumerate(zip(manifest.tensors, frames, strict=True)):
        d = decode(frame)
        size = itemsize_of(t.dtype)
        if d.index != i or d.name != t.name or d.itemsize != size or d.count * size != t.nbytes:
            raise DeltaError(f"tensor frame {i} is for {d.name!r} (index {d.index}, {d.count} x {d.itemsize} "
                             f"bytes); the manifest has {t.name!r} ({t.nbytes} bytes of {t.dtype}) there")
        plans.append(_plan(d))
    return plans


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
            _write(np.frombuffer(view[t.offset : t.offset + t.nbytes], dtype=_UINT[itemsize_of(t.dtype)]), plan)
    chunks, digest = version_digests(manifest, view, header.algo)
    if digest != header.digest:
        raise DeltaDigestMismatch(
            f"delta {header.base_version} -> {header.version} gave digest {digest[:23]}, the publisher's is "
            f"{header.digest[:23]}: the buffer holds neither version; take a full version")
    return Applied(header.version, digest, tuple(chunks), sum(p.changed for p in plans), sum(len(f) for f in frames))
