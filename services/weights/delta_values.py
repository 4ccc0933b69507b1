"""The value section of a tensor delta (``services.weights.delta``): how the changed elements' new
values are written, and the LEB128 varints the index section shares.

Elements are unsigned integers of the element size (``uint16`` for bfloat16/float16, ``uint32`` for
float32), i.e. the raw bit patterns. Three codings of ``n`` values:

- ``planes``: the new values' bytes, byte plane by byte plane (``n * itemsize`` bytes): a float's
  exponent bytes sit together, which is what makes them deflate;
- ``diff_varints``: per element the new pattern minus the old one modulo ``2 ** (8 * itemsize)``,
  read as a signed integer and zigzag-mapped (0, -1, 1, -2, ... to 0, 1, 2, 3, ...), as LEB128
  varints: IEEE floats are sign-magnitude, so a value moved by a few ulps without changing sign has a
  pattern a few units away, and one byte holds a move of up to 64 ulps either way;
- ``diff_planes``: the same zigzag differences at full width, byte plane by byte plane (their high
  planes are nearly all zero and deflate to almost nothing).

A difference coding needs the base's values to apply (``new = old + unzigzag(z)``, wrapping), and is
exact bit for bit: a sign flip, NaN or infinity is just a larger difference.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from services.common.weights import WeightError

Coding = Literal["planes", "diff_varints", "diff_planes"]
CODINGS: tuple[Coding, ...] = ("planes", "diff_varints", "diff_planes")
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_SINT = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
MAX_VARINT = 10  # bytes of a LEB128 uint64
_CHUNK = 1 << 22  # elements encoded at a time: bounds the temporaries of a large tensor


class DeltaError(WeightError):
    """A delta is malformed, truncated, or does not fit what it is applied to (kind ``argument``
    unless a subclass says otherwise). ``services.weights.delta`` exports it."""

    def __init__(self, message: str, kind: str = "argument") -> None:
        super().__init__(kind, message)


def varint_max_len(bits: int) -> int:
    """Bytes of the longest LEB128 encoding of a ``bits``-bit unsigned integer."""
    return max(1, -(-bits // 7))


def varint_lengths(values: np.ndarray) -> np.ndarray:
    """Bytes of each value's LEB128 encoding (int64; values: any unsigned integer array)."""
    lengths = np.ones(len(values), dtype=np.int64)
    top = int(values.max()) if len(values) else 0  # no pass for lengths no value reaches
    for j in range(1, varint_max_len(max(top.bit_length(), 1))):
        lengths += values >= np.uint64(1 << (7 * j))
    return lengths


def varint_bytes(values: np.ndarray) -> int:
    """Bytes of all values' LEB128 encodings (summed a chunk at a time)."""
    return sum(int(varint_lengths(values[lo : lo + _CHUNK]).sum()) for lo in range(0, len(values), _CHUNK))


def encode_varints(values: np.ndarray) -> bytes:
    """LEB128 of every value (an unsigned integer array), back to back, a byte position at a time."""
    parts = []
    for lo in range(0, len(values), _CHUNK):
        v = values[lo : lo + _CHUNK].astype(np.uint64, copy=False)
        lengths = varint_lengths(v)
        out = np.empty(int(lengths.sum()), dtype=np.uint8)
        starts = np.cumsum(lengths) - lengths
        for j in range(int(lengths.max(initial=0))):
            has = lengths > j
            byte = (v[has] >> np.uint64(7 * j)) & np.uint64(0x7F)
            more = (lengths[has] > j + 1).astype(np.uint64) << np.uint64(7)
            out[starts[has] + j] = (byte | more).astype(np.uint8)
        parts.append(out.tobytes())
    return b"".join(parts)


def decode_varints(buf: np.ndarray, n: int, max_len: int, bits: int = 64, what: str = "index") -> np.ndarray:
    """Exactly ``n`` LEB128 values filling ``buf`` (uint8), each of at most ``max_len`` bytes and
    ``bits`` bits (uint64 result); anything else raises."""
    if n == 0:
        if len(buf):
            raise DeltaError(f"{len(buf)} {what} bytes for no value")
        return np.zeros(0, dtype=np.uint64)
    ends = np.flatnonzero((buf & 0x80) == 0)
    if len(ends) != n or ends[-1] != len(buf) - 1:
        raise DeltaError(f"{what} section holds {len(ends)} complete varints (last ends at byte "
                          f"{ends[-1] + 1 if len(ends) else 0} of {len(buf)}), expected {n}")
    starts = np.empty(n, dtype=np.int64)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    longest = int(lengths.max())
    if longest > max_len:
        raise DeltaError(f"a {what} varint of {longest} bytes: longer than {max_len}")
    full = varint_max_len(bits)
    if longest == full and int(buf[ends[lengths == full]].max()) >> (bits - 7 * (full - 1)):
        raise DeltaError(f"a {what} varint overflows {bits} bits")
    out = np.zeros(n, dtype=np.uint64)
    for j in range(longest):
        has = lengths > j
        out[has] |= (buf[starts[has] + j] & 0x7F).astype(np.uint64) << np.uint64(7 * j)
    return out


def planes(values: np.ndarray) -> bytes:
    """Values' bytes byte plane by byte plane."""
    itemsize = values.dtype.itemsize
    return values.view(np.uint8).reshape(len(values), itemsize).T.tobytes()


def unplanes(raw: np.ndarray, itemsize: int) -> np.ndarray:
    n = len(raw) // itemsize
    return np.ascontiguousarray(raw.reshape(itemsize, n).T).view(UINT[itemsize]).reshape(n)


def zigzag_diff(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """``new - old`` modulo the element width, zigzag-mapped (same unsigned dtype)."""
    signed = (new - old).view(_SINT[new.dtype.itemsize])  # unsigned arrays wrap
    return ((signed << 1) ^ (signed >> (8 * new.dtype.itemsize - 1))).view(new.dtype)


def unzigzag_add(old: np.ndarray, zz: np.ndarray) -> np.ndarray:
    """``old`` plus the differences ``zz`` that ``zigzag_diff`` made, modulo the element width."""
    return old + ((zz >> 1) ^ (np.zeros_like(zz) - (zz & 1)))


def cost(coding: Coding, zz: np.ndarray) -> tuple[int, int]:
    """Raw bytes of the changed values (their zigzag differences ``zz``) in ``coding``, and the bytes
    each unchanged element costs when the whole tensor is written."""
    itemsize = zz.dtype.itemsize
    if coding == "diff_varints":
        return varint_bytes(zz), 1
    return len(zz) * itemsize, itemsize


def encode_values(coding: Coding, new: np.ndarray, zz: np.ndarray) -> bytes:
    """The value section of ``n`` elements: their new values ``new`` or differences ``zz``."""
    if coding == "planes":
        return planes(new)
    return encode_varints(zz) if coding == "diff_varints" else planes(zz)


def value_bytes_fit(coding: Coding, size: int, n: int, itemsize: int) -> bool:
    """Whether a value section of ``size`` bytes can hold ``n`` values in ``coding``."""
    if coding == "diff_varints":
        return n <= size <= n * varint_max_len(8 * itemsize)
    return size == n * itemsize


def decode_values(coding: Coding, raw: np.ndarray, n: int, itemsize: int) -> np.ndarray:
    """The ``n`` values (new values for ``planes``, zigzag differences otherwise) of a section."""
    if coding == "diff_varints":
        bits = 8 * itemsize
        return decode_varints(raw, n, varint_max_len(bits), bits, "value").astype(UINT[itemsize])
    return unplanes(raw, itemsize)
