"""Delta weight versions: only the elements that changed since the previous version cross the link.

A version is a ``Manifest`` of tensors back to back in one blob (``services.common.weights``). A
delta from version ``b`` to version ``v`` of the same model, in the dtype the SGS serves, is a list
of frames: one *version frame*, then one *tensor frame* per tensor of the manifest, in its order.
Everything works on raw bytes: an element is ``itemsize`` bytes (2 for bfloat16/float16, 4 for
float32, from the manifest's dtype) compared bit for bit, so ``-0.0`` vs ``0.0`` or a NaN payload
counts as a change and the applied result is bit-identical to the new version.

Each frame starts with ``MAGIC``, ``FORMAT`` and its kind (fields: ``_VERSION``, ``_TENSOR``); a
reader refuses any other format, older or newer. The version frame names the base and new
versions, their version digests as the full push computes them (SHA-256 over the chunk digests of
the manifest's plan), the chunk digest algorithm, ``chunk_bytes`` and the manifest's fingerprint. A
tensor frame carries the tensor's index and name, element size and count, the changed count, the
mode, the value coding and the codec, the index section's size, the payload's size inflated and as
sent, and an xxh3_64 of the payload. The payload is an index section, then a value section
(``services.weights.delta_values``): the changed elements' new values byte plane by byte plane
(``planes``), or their differences from the base's values as zigzag varints (``diff_varints``) or
zigzag byte planes (``diff_planes``). The index section's mode is one of:

- ``gaps``: LEB128 varints of the gaps between changed indices (the first index, then
  ``index[i] - index[i-1] - 1``): about one byte per change when changes are dense enough;
- ``bitmap``: one bit per element (``ceil(count / 8)`` bytes), for changes too dense for gaps;
- ``whole``: no index, every element's value (or difference, zero where unchanged) is sent.

Per value coding the encoder takes the mode with the smallest raw payload, deflates the payload
(zlib, level ``level``; kept so only when that saves ``COMPRESS_MIN_GAIN``; the lock has no zstd or
lz4), and sends the coding whose payload came out smallest (ties: ``planes``, which applies without
reading the base). ``codings`` narrows the choice (``("planes",)``: format 1's values).

Checks, and what a refusal leaves behind:

- ``apply`` (one tensor) parses and checks the whole frame (lengths, checksum, mode, coding,
  section sizes, inflated size, every index in range, bitmap padding, every varint complete and in
  range, a difference for every changed element, base size and writability) before it writes a
  byte: a refused frame leaves the base untouched. Every refusal is a ``DeltaError`` (a
  ``WeightError``, so the gRPC edge maps its kind); nothing raises ``IndexError`` or ``struct.error``.
- ``services.weights.delta_version`` puts the frames of a whole version together and applies
  them (the version frame, digests, ``apply_version``).

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

from services.common.weights import TensorSpec
from services.weights import delta_values as V
from services.weights.delta_values import CODINGS, Coding, DeltaError

FORMAT = 2  # 1: values as planes only, no value coding or index size in the tensor header
MAGIC = b"BRDD"
KIND_VERSION, _KIND_TENSOR = 1, 2
Mode = Literal["gaps", "bitmap", "whole"]
MODES: tuple[Mode, ...] = ("gaps", "bitmap", "whole")
COMPRESS_MIN_GAIN = 0.02  # deflated output kept only if it saves this share: inflating costs the receiver CPU
COMPRESS_MIN_BYTES = 256  # below this zlib's own framing eats the gain
SAMPLE_BYTES = 1 << 14  # a section longer than twice this is judged by deflating its first SAMPLE_BYTES

# magic, format, kind, mode, value coding, codec, itemsize, index, count, changed, index bytes, raw bytes,
# payload bytes, xxh3_64, name length
_TENSOR = struct.Struct("<4sBBBBBBIQQQQQQH")


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
    coding: Coding
    compressed: bool
    index_bytes: int  # the index section's size; the value section is the rest of the inflated payload
    raw_bytes: int  # the payload's size inflated
    payload: bytes | memoryview
    frame_bytes: int


@dataclass(frozen=True)
class Plan:
    """A decoded, checked tensor delta: the positions to write (None: the whole tensor) and the new
    values there, or (``diff``) the zigzag differences to add to the base's values."""

    positions: np.ndarray | None
    values: np.ndarray
    changed: int
    diff: bool


def itemsize_of(dtype: str) -> int:
    """Bytes per element of a manifest dtype name."""
    return TensorSpec(dtype, ()).nbytes


# ------------------------------------------------------------------------------------------ one tensor
def view_of(buf, what: str) -> memoryview:
    """``buf`` as a flat byte view; refused when it is not a contiguous buffer."""
    try:
        return memoryview(buf).cast("B")
    except TypeError as err:
        raise DeltaError(f"{what} is not a contiguous byte buffer: {err}") from None


def _elements(buf, itemsize: int, what: str) -> np.ndarray:
    if itemsize not in V.UINT:
        raise DeltaError(f"element size {itemsize} is not one of {sorted(V.UINT)}")
    mv = view_of(buf, what)
    if len(mv) % itemsize:
        raise DeltaError(f"{what} has {len(mv)} bytes, not a whole number of {itemsize}-byte elements")
    return np.frombuffer(mv, dtype=V.UINT[itemsize])


def changed_positions(prev, new, itemsize: int) -> np.ndarray:
    """Indices (int64, ascending) of the elements whose bytes differ between two images of a tensor."""
    a, b = _elements(prev, itemsize, "previous tensor"), _elements(new, itemsize, "new tensor")
    if len(a) != len(b):
        raise DeltaError(f"previous tensor has {len(a)} elements, the new one {len(b)}")
    return np.flatnonzero(a != b)


def choose_mode(count: int, changed: int, gap_bytes: int, value_bytes: int, unchanged_cost: int) -> Mode:
    """The mode with the smallest raw payload (ties: the cheaper one to apply, ``whole`` first), given
    the changed values' bytes and what each unchanged element costs in ``whole`` mode."""
    sizes = {"whole": value_bytes + (count - changed) * unchanged_cost,
             "bitmap": -(-count // 8) + value_bytes, "gaps": gap_bytes + value_bytes}
    return min(("whole", "bitmap", "gaps"), key=lambda m: sizes[m])  # type: ignore[return-value]


def _deflated(raw: bytes, level: int) -> tuple[bytes, int]:
    """The payload as sent and its codec (1: zlib) when deflating saves ``COMPRESS_MIN_GAIN``."""
    if level > 0 and len(raw) >= COMPRESS_MIN_BYTES:
        packed = zlib.compress(raw, level)
        if len(packed) <= len(raw) * (1 - COMPRESS_MIN_GAIN):
            return packed, 1
    return raw, 0


def _deflated_size(section: bytes, level: int) -> float:
    """About how many bytes ``section`` deflates to: exactly for a short one, else from deflating its
    first ``SAMPLE_BYTES`` (the encoder then deflates only the candidate it chose, not all three)."""
    if level <= 0 or len(section) < COMPRESS_MIN_BYTES:
        return float(len(section))
    if len(section) <= 2 * SAMPLE_BYTES:
        return float(len(_deflated(section, level)[0]))
    sample = section[:SAMPLE_BYTES]
    return len(_deflated(sample, level)[0]) * len(section) / SAMPLE_BYTES


def _gaps(pos: np.ndarray) -> np.ndarray:
    """The gaps between changed positions: the first index, then ``index[i] - index[i-1] - 1``."""
    return (np.diff(pos, prepend=-1) - 1).astype(np.uint64)


def _gap_bytes(pos: np.ndarray, chunk: int = 1 << 22) -> int:
    """Bytes of the gaps' varints, a chunk of positions at a time (each chunk from the one before it)."""
    return sum(V.varint_bytes(_gaps(pos[max(lo - 1, 0) : lo + chunk])[lo > 0 :]) for lo in range(0, len(pos), chunk))


def _index_section(count: int, pos: np.ndarray, mode: Mode) -> bytes:
    """The index section of ``mode`` (none for ``whole``)."""
    if mode == "whole":
        return b""
    if mode == "gaps":
        return V.encode_varints(_gaps(pos))
    mask = np.zeros(count, dtype=bool)
    mask[pos] = True
    return np.packbits(mask, bitorder="little").tobytes()


def _payload(old: np.ndarray, new: np.ndarray, pos: np.ndarray, mode: Mode, coding: Coding,
             heads: dict[Mode, bytes]) -> tuple[bytes, bytes]:
    """The index section and the value section of one mode and coding (``heads``: index sections
    made so far, shared by the codings)."""
    if mode not in heads:
        heads[mode] = _index_section(len(new), pos, mode)
    head = heads[mode]
    if mode == "whole":
        return head, V.encode_values(coding, new, V.zigzag_diff(old, new) if coding != "planes" else new)
    changed = new[pos]
    return head, V.encode_values(coding, changed, V.zigzag_diff(old[pos], changed) if coding != "planes" else changed)


def encode(prev, new, itemsize: int, *, index: int = 0, name: str = "", level: int = 1,
           codings: Sequence[Coding] = CODINGS) -> bytes:
    """The tensor frame turning ``prev`` (bytes of the base's tensor) into ``new``; ``level``: zlib
    level (0: never deflate); ``codings``: the value codings to choose from (the smallest wins)."""
    name_b = name.encode()
    if len(name_b) > 0xFFFF or not 0 <= index < 1 << 32:
        raise DeltaError(f"tensor name of {len(name_b)} bytes or index {index} does not fit a frame")
    if not codings or any(c not in CODINGS for c in codings):
        raise DeltaError(f"value codings {list(codings)}: choose from {list(CODINGS)}")
    old_el, new_el = _elements(prev, itemsize, "previous tensor"), _elements(new, itemsize, "new tensor")
    return _frame(old_el, new_el, changed_positions(old_el, new_el, itemsize), itemsize, index, name_b, level, codings)


def encode_positions(new, pos: np.ndarray | None, itemsize: int, *, index: int = 0, name: str = "",
                     level: int = 1) -> bytes:
    """The tensor frame writing ``new``'s values at ``pos`` (ascending int64; None: every element),
    as ``planes``: it needs no base values, so it is what a chain of deltas composes to (a listed
    element need not differ from the base)."""
    name_b = name.encode()
    if len(name_b) > 0xFFFF or not 0 <= index < 1 << 32:
        raise DeltaError(f"tensor name of {len(name_b)} bytes or index {index} does not fit a frame")
    new_el = _elements(new, itemsize, "new tensor")
    pos = np.arange(len(new_el), dtype=np.int64) if pos is None else pos
    if len(pos) and (int(pos[0]) < 0 or int(pos[-1]) >= len(new_el)):
        raise DeltaError(f"positions {int(pos[0])}..{int(pos[-1])} outside a tensor of {len(new_el)} elements")
    return _frame(new_el, new_el, pos, itemsize, index, name_b, level, ("planes",))


def positions_of(frame) -> np.ndarray | None:
    """The positions a tensor frame (bytes, or a ``decode``d one) writes (int64, ascending; None: the
    whole tensor), checked."""
    d = frame if isinstance(frame, TensorDelta) else decode(frame)
    if d.mode == "whole":
        return None
    _check_sections(d)
    return _positions(d, _inflate(d)[: d.index_bytes])


def _frame(old_el: np.ndarray, new_el: np.ndarray, pos: np.ndarray, itemsize: int, index: int, name_b: bytes,
           level: int, codings: Sequence[Coding]) -> bytes:
    """The frame of ``pos`` changed (from ``old_el`` to ``new_el``): the smallest coding's payload."""
    count, changed = len(new_el), len(pos)
    gap_bytes = _gap_bytes(pos)
    zz = V.zigzag_diff(old_el[pos], new_el[pos]) if set(codings) - {"planes"} else new_el[:0]
    best, heads, sizes = None, {}, {}
    for coding in (c for c in CODINGS if c in codings):  # ``planes`` first: it wins ties
        mode = choose_mode(count, changed, gap_bytes, *V.cost(coding, zz if coding != "planes" else new_el[pos]))
        head, values = _payload(old_el, new_el, pos, mode, coding, heads)
        if mode not in sizes:
            sizes[mode] = _deflated_size(head, level)
        size = sizes[mode] + _deflated_size(values, level)
        if best is None or size < best[0]:
            best = (size, mode, coding, head, values)
    _, mode, coding, head, values = best
    payload, codec = _deflated(head + values, level)
    index_bytes, raw_bytes = len(head), len(head) + len(values)
    header = _TENSOR.pack(MAGIC, FORMAT, _KIND_TENSOR, MODES.index(mode), CODINGS.index(coding), codec, itemsize,
                          index, count, changed, index_bytes, raw_bytes, len(payload),
                          xxhash.xxh3_64_intdigest(payload), len(name_b))
    return b"".join((header, name_b, payload))


def check_magic(mv: memoryview, kind: int, what: str, header: int) -> None:
    if mv[:4] != MAGIC or len(mv) < 6:
        raise DeltaError(f"not a delta frame (starts {bytes(mv[:6])!r}, expected {MAGIC!r}, format, kind)")
    _, fmt, got = struct.unpack_from("<4sBB", mv)
    if fmt != FORMAT:
        age = "an older" if fmt < FORMAT else "a newer"
        raise DeltaError(f"delta frame format {fmt} ({age} codec's); this reader knows format {FORMAT} only: "
                         "re-encode the delta with this codec or take a full version")
    if got != kind:
        raise DeltaError(f"frame of kind {got} where a {what} frame (kind {kind}) was expected")
    if len(mv) < header:
        raise DeltaError(f"{what} frame of {len(mv)} bytes: shorter than its {header}-byte header")


def decode(frame) -> TensorDelta:
    """Parse a tensor frame's header and check its length and payload checksum."""
    mv = view_of(frame, "tensor frame")
    check_magic(mv, _KIND_TENSOR, "tensor", _TENSOR.size)
    (_, _, _, mode, coding, codec, itemsize, index, count, changed, index_bytes, raw, size, check,
     name_len) = _TENSOR.unpack_from(mv)
    want = _TENSOR.size + name_len + size
    if len(mv) != want:
        raise DeltaError(f"tensor frame {index} has {len(mv)} bytes, its header says {want} (truncated or overlong)")
    if mode >= len(MODES) or coding >= len(CODINGS) or codec > 1 or itemsize not in V.UINT:
        raise DeltaError(f"tensor frame {index}: unknown mode {mode}, value coding {coding}, codec {codec} or "
                         f"element size {itemsize}")
    if changed > count:
        raise DeltaError(f"tensor frame {index}: {changed} changed elements of {count}")
    payload = mv[_TENSOR.size + name_len :]
    if xxhash.xxh3_64_intdigest(payload) != check:
        raise DeltaError(f"tensor frame {index}: payload checksum mismatch (corrupted in transit)", "integrity")
    try:
        name = bytes(mv[_TENSOR.size : _TENSOR.size + name_len]).decode()
    except UnicodeDecodeError:
        raise DeltaError(f"tensor frame {index}: its name is not UTF-8") from None
    return TensorDelta(index, name, itemsize, count, changed, MODES[mode], CODINGS[coding], codec == 1, index_bytes,
                       raw, payload, len(mv))


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


def _check_sections(d: TensorDelta) -> None:
    """Refuse section sizes the mode, coding and counts cannot have (before inflating anything)."""
    head, n = d.index_bytes, d.count if d.mode == "whole" else d.changed
    max_gap = V.varint_max_len(max(d.count, 1).bit_length())
    fits = {"whole": head == 0, "bitmap": head == -(-d.count // 8),
            "gaps": d.changed <= head <= d.changed * max_gap}[d.mode]
    if not fits or head > d.raw_bytes or not V.value_bytes_fit(d.coding, d.raw_bytes - head, n, d.itemsize):
        raise DeltaError(f"tensor {d.name!r}: {d.raw_bytes} payload bytes ({head} of index) cannot hold {d.changed} "
                         f"of {d.count} elements in mode {d.mode} with values {d.coding}")


def _positions(d: TensorDelta, index: np.ndarray) -> np.ndarray:
    """The changed elements' positions (int64, ascending, in range) from the index section."""
    if d.mode == "bitmap":
        bits = np.unpackbits(index, bitorder="little")
        if bits[d.count :].any():
            raise DeltaError(f"tensor {d.name!r}: bitmap bits set past its {d.count} elements")
        pos = np.flatnonzero(bits[: d.count])
    else:
        gaps = V.decode_varints(index, d.changed, V.varint_max_len(max(d.count, 1).bit_length()))
        if d.changed and int(gaps.max()) >= d.count:
            raise DeltaError(f"tensor {d.name!r}: index gap {int(gaps.max())} out of range ({d.count} elements)")
        pos = (np.cumsum(gaps + np.uint64(1)) - np.uint64(1)).astype(np.int64)
    if len(pos) != d.changed or (len(pos) and int(pos[-1]) >= d.count):
        last = int(pos[-1]) if len(pos) else -1
        raise DeltaError(f"tensor {d.name!r}: {len(pos)} positions (last {last}) for {d.changed} changed "
                         f"elements of {d.count}: index out of range")
    return pos


def plan_of(d: TensorDelta) -> Plan:
    """Inflate and check a tensor delta completely: every position in range, values of the right size,
    a nonzero difference exactly where an element changed."""
    _check_sections(d)
    raw = _inflate(d)
    values = V.decode_values(d.coding, raw[d.index_bytes :], d.count if d.mode == "whole" else d.changed, d.itemsize)
    pos = None if d.mode == "whole" else _positions(d, raw[: d.index_bytes])
    diff = d.coding != "planes"
    if diff:
        nonzero = int(np.count_nonzero(values))
        if nonzero != d.changed:
            raise DeltaError(f"tensor {d.name!r}: {nonzero} nonzero differences for {d.changed} changed elements")
    return Plan(pos, values, d.changed, diff)


def _target(base, d: TensorDelta) -> np.ndarray:
    mv = view_of(base, f"the base of tensor {d.name!r}")
    if mv.readonly:
        raise DeltaError(f"tensor {d.name!r}: the base buffer is read-only")
    if len(mv) != d.count * d.itemsize:
        raise DeltaError(f"tensor {d.name!r}: base of {len(mv)} bytes, the delta is for "
                         f"{d.count} x {d.itemsize} = {d.count * d.itemsize}")
    return np.frombuffer(mv, dtype=V.UINT[d.itemsize])


def write_plan(target: np.ndarray, plan: Plan) -> None:
    where = slice(None) if plan.positions is None else plan.positions
    target[where] = V.unzigzag_add(target[where], plan.values) if plan.diff else plan.values


def apply(base, delta) -> int:
    """Apply one tensor frame (bytes, or a ``decode``d one) to ``base`` (a writable buffer holding the
    base's bytes of that tensor) in place; returns the number of changed elements. Everything is
    checked before the first byte is written: a refused delta leaves ``base`` as it was."""
    d = delta if isinstance(delta, TensorDelta) else decode(delta)
    target = _target(base, d)
    write_plan(target, plan_of(d))
    return d.changed
