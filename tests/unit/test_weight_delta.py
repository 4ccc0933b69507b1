"""The delta codec of weight versions (``services.weights.delta``): round trips, mode choice, sizes,
digests against the full push's, and every malformed delta refused with its message."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import xxhash

from services.common.weights import Manifest, TensorSpec, WeightError, manifest_of
from services.weights import delta as D
from services.weights import delta_values as V
from services.weights import delta_version as DV
from services.weights.datapath import LazyDigests

FRACTIONS = (0.0, 0.01, 0.3, 1.0)
ITEMSIZE = {"float32": 4, "bfloat16": 2}
N = 50_000


def _image(rng: np.random.Generator, n: int, dtype: str) -> np.ndarray:
    """Weight-like values (normal, std 0.02) as the raw elements of ``dtype`` (bf16: fp32's top half)."""
    bits = (rng.standard_normal(n).astype(np.float32) * 0.02).view(np.uint32)
    return bits if dtype == "float32" else (bits >> 16).astype(np.uint16)


def _changed(rng: np.random.Generator, prev: np.ndarray, frac: float) -> tuple[np.ndarray, np.ndarray]:
    """``prev`` with ``frac`` of its elements changed (the lowest mantissa bit flipped: a real change
    of one ulp, as an optimizer step makes); returns (new, changed positions)."""
    pos = np.sort(rng.choice(len(prev), round(len(prev) * frac), replace=False))
    new = prev.copy()
    new[pos] ^= 1
    return new, pos


def _pair(dtype: str, frac: float, n: int = N, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    prev = _image(rng, n, dtype)
    new, pos = _changed(rng, prev, frac)
    return prev, new, pos


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("frac", FRACTIONS)
def test_a_tensor_round_trips_bit_identical(dtype, frac):
    prev, new, pos = _pair(dtype, frac)
    frame = D.encode(prev.tobytes(), new.tobytes(), ITEMSIZE[dtype], index=3, name="w")
    base = bytearray(prev.tobytes())
    assert D.apply(base, frame) == len(pos)
    assert bytes(base) == new.tobytes()
    d = D.decode(frame)
    assert (d.index, d.name, d.count, d.changed) == (3, "w", N, len(pos))


@pytest.mark.parametrize(("dtype", "frac", "mode"), [
    ("bfloat16", 0.0, "gaps"), ("bfloat16", 0.01, "gaps"), ("bfloat16", 0.3, "bitmap"),
    ("bfloat16", 0.5, "bitmap"), ("bfloat16", 0.97, "whole"), ("bfloat16", 1.0, "whole"),
    ("float32", 0.01, "gaps"), ("float32", 0.3, "bitmap"), ("float32", 0.95, "bitmap"), ("float32", 1.0, "whole"),
])
def test_the_mode_follows_the_share_changed(dtype, frac, mode):
    prev, new, _ = _pair(dtype, frac)
    d = D.decode(D.encode(prev.tobytes(), new.tobytes(), ITEMSIZE[dtype], codings=("planes",)))
    assert (d.mode, d.coding) == (mode, "planes")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("frac", FRACTIONS)
def test_a_frame_is_no_larger_than_its_mode_promises(dtype, frac):
    prev, new, pos = _pair(dtype, frac)
    s, k = ITEMSIZE[dtype], len(pos)
    frame = D.encode(prev.tobytes(), new.tobytes(), s, name="w", codings=("planes",))
    d = D.decode(frame)
    index = {"gaps": int(V.varint_lengths(np.diff(pos, prepend=-1).astype(np.uint64) - 1).sum()),
             "bitmap": -(-N // 8), "whole": 0}[d.mode]
    values = N * s if d.mode == "whole" else k * s
    assert len(frame) <= 64 + len("w") + index + values
    assert d.raw_bytes == index + values and d.index_bytes == index
    assert len(D.encode(prev.tobytes(), new.tobytes(), s, name="w")) <= len(frame)  # the choice only helps


def test_one_percent_of_a_bf16_tensor_changed_is_well_under_five_percent_of_it():
    prev, new, _ = _pair("bfloat16", 0.01, n=1_000_000)
    frame = D.encode(prev.tobytes(), new.tobytes(), 2)
    assert len(frame) < 0.02 * 2_000_000  # 1% of the values (2 bytes) plus ~1 byte of gap each


def test_no_change_costs_only_the_header():
    prev, new, _ = _pair("bfloat16", 0.0)
    frame = D.encode(prev.tobytes(), new.tobytes(), 2, name="w")
    assert len(frame) == D._TENSOR.size + 1


def test_compression_is_kept_only_when_it_pays():
    prev = np.zeros(N, dtype=np.uint16)
    alike = prev.copy()
    alike[::50] = 0x3F80  # every changed value the same: deflates to almost nothing
    packed = D.decode(D.encode(prev.tobytes(), alike.tobytes(), 2))
    assert packed.compressed and len(packed.payload) < packed.raw_bytes / 4
    assert not D.decode(D.encode(prev.tobytes(), alike.tobytes(), 2, level=0)).compressed
    noise = np.random.default_rng(1).integers(1, 1 << 16, N, dtype=np.uint16)  # nothing to deflate
    assert not D.decode(D.encode(prev.tobytes(), noise.tobytes(), 2)).compressed
    base = bytearray(prev.tobytes())
    D.apply(base, D.encode(prev.tobytes(), alike.tobytes(), 2))
    assert bytes(base) == alike.tobytes()


def test_a_zero_size_tensor_round_trips():
    frame = D.encode(b"", b"", 4)
    assert D.apply(bytearray(), frame) == 0


def test_bits_not_values_decide_what_changed():
    prev = np.array([0.0, 1.0, np.nan], dtype=np.float32)
    new = np.array([-0.0, 1.0, np.nan], dtype=np.float32)
    new.view(np.uint32)[2] |= 1  # another NaN payload
    pos = D.changed_positions(prev.tobytes(), new.tobytes(), 4)
    assert pos.tolist() == [0, 2]
    base = bytearray(prev.tobytes())
    D.apply(base, D.encode(prev.tobytes(), new.tobytes(), 4))
    assert bytes(base) == new.tobytes()


# ------------------------------------------------------------------------------ malformed tensor frames
def _frame(dtype="bfloat16", frac=0.01, **kw) -> tuple[bytes, np.ndarray, np.ndarray]:
    prev, new, _ = _pair(dtype, frac)
    return D.encode(prev.tobytes(), new.tobytes(), ITEMSIZE[dtype], name="w", **kw), prev, new


def _reheader(frame: bytes, **fields) -> bytes:
    """``frame`` with header fields replaced (payload optional), its checksum recomputed."""
    names = ("magic", "fmt", "kind", "mode", "coding", "codec", "itemsize", "index", "count", "changed", "index_bytes",
             "raw", "size",
             "check", "name_len")
    head = dict(zip(names, D._TENSOR.unpack_from(frame), strict=True))
    name = frame[D._TENSOR.size : D._TENSOR.size + head["name_len"]]
    payload = fields.pop("payload", frame[D._TENSOR.size + head["name_len"] :])
    head.update(size=len(payload), check=xxhash.xxh3_64_intdigest(payload))
    head.update(fields)
    return D._TENSOR.pack(*head.values()) + name + payload


def _refused(base: bytearray, frame, match: str, kind: str = "argument") -> None:
    before = bytes(base)
    with pytest.raises(D.DeltaError, match=match) as err:
        D.apply(base, frame)
    assert err.value.kind == kind
    assert bytes(base) == before  # a refused frame writes nothing


def test_a_truncated_or_overlong_frame_is_refused():
    frame, prev, _ = _frame()
    _refused(bytearray(prev.tobytes()), frame[:-1], "truncated or overlong")
    _refused(bytearray(prev.tobytes()), frame + b"\0", "truncated or overlong")
    _refused(bytearray(prev.tobytes()), frame[:10], "shorter than its")
    _refused(bytearray(prev.tobytes()), frame[:3], "not a delta frame")


def test_a_frame_that_is_not_a_delta_or_of_another_format_is_refused():
    frame, prev, _ = _frame()
    _refused(bytearray(prev.tobytes()), b"XXXX" + frame[4:], "not a delta frame")
    _refused(bytearray(prev.tobytes()), _reheader(frame, fmt=D.FORMAT + 1),
             r"format 3 \(a newer codec's\); this reader knows format 2 only")
    _refused(bytearray(prev.tobytes()), _reheader(frame, fmt=1), r"format 1 \(an older codec's\)")
    _refused(bytearray(prev.tobytes()), _reheader(frame, mode=7), "unknown mode 7")
    _refused(bytearray(prev.tobytes()), _reheader(frame, itemsize=3), "element size 3")
    _refused(bytearray(prev.tobytes()), DV.encode_header(DV.DeltaHeader(0, 1, 8, 1, "sha256", "", "", "")),
             "where a tensor frame")


def test_a_corrupted_payload_is_refused_by_its_checksum():
    frame, prev, _ = _frame()
    bad = bytearray(frame)
    bad[-5] ^= 0x10
    _refused(bytearray(prev.tobytes()), bytes(bad), "checksum mismatch", kind="integrity")


def test_a_base_of_the_wrong_size_or_read_only_is_refused():
    frame, prev, _ = _frame()
    _refused(bytearray(prev.tobytes()[:-2]), frame, r"base of 99998 bytes, the delta is for 50000 x 2")
    with pytest.raises(D.DeltaError, match="read-only"):
        D.apply(prev.tobytes(), frame)


def test_an_index_out_of_range_is_refused():
    prev = np.zeros(1000, dtype=np.uint16)
    new = prev.copy()
    new[999] = 1
    frame = D.encode(prev.tobytes(), new.tobytes(), 2)  # gaps: one gap of 999
    _refused(bytearray(500 * 2), _reheader(frame, count=500), "index gap 999 out of range")
    new[[1, 999]] = 1
    bitmap = D.encode(prev.tobytes(), new.tobytes(), 2, level=0)
    near = V.encode_varints(np.array([998, 5], np.uint64))  # 998, then 998 + 5 + 1 = 1004 > 999
    _refused(bytearray(prev.tobytes()), _reheader(bitmap, payload=near + b"\0\1\0\1", mode=0, coding=0,
                                                          index_bytes=len(near), raw=len(near) + 4),
             "index out of range")


def test_set_bits_past_the_end_of_a_bitmap_are_refused():
    prev = np.zeros(12, dtype=np.uint32)
    new = prev.copy()
    new[::2] = 7  # 50%: bitmap
    frame = D.encode(prev.tobytes(), new.tobytes(), 4, level=0)
    assert D.decode(frame).mode == "bitmap"
    head = D._TENSOR.size
    payload = bytearray(frame[head:])
    payload[1] |= 0x80  # bit 15 of 12
    _refused(bytearray(prev.tobytes()), _reheader(frame, payload=bytes(payload)), "bitmap bits set past its 12")


def test_a_count_of_changes_that_the_payload_cannot_hold_is_refused():
    frame, prev, _ = _frame(level=0, codings=("planes",))
    d = D.decode(frame)
    assert d.mode == "gaps"
    _refused(bytearray(prev.tobytes()), _reheader(frame, changed=d.changed + 1), "cannot hold 501 of")
    _refused(bytearray(prev.tobytes()), _reheader(frame, changed=d.raw_bytes // 3 + 1), "cannot hold")
    _refused(bytearray(prev.tobytes()), _reheader(frame, changed=1), "cannot hold")  # > 10 index bytes per change
    _refused(bytearray(prev.tobytes()), _reheader(frame, changed=N + 1), "changed elements of")


def test_a_payload_that_does_not_inflate_to_its_size_is_refused():
    frame, prev, _ = _frame("bfloat16", 0.3)  # bitmap + values: compressible (the values' exponent planes)
    d = D.decode(frame)
    assert d.compressed
    _refused(bytearray(prev.tobytes()), _reheader(frame, payload=b"\x78\x9c" + b"\xff" * 40), "does not inflate")
    short = _reheader(frame, raw=d.raw_bytes + 2, changed=d.changed + 1)
    _refused(bytearray(prev.tobytes()), short, "inflates to")


def test_a_fuzzed_frame_raises_a_delta_error_or_applies_never_anything_else():
    rng = np.random.default_rng(7)
    prev, new, _ = _pair("bfloat16", 0.05, n=2000)
    for level in (0, 6):
        frame = D.encode(prev.tobytes(), new.tobytes(), 2, name="w", level=level)
        for _ in range(300):
            bad = bytearray(frame)
            for i in rng.integers(0, len(bad), rng.integers(1, 4)):
                bad[i] = int(rng.integers(0, 256))
            if rng.random() < 0.5:  # past the checksum, into the parser
                bad = bytearray(_reheader(bytes(bad), payload=bytes(bad[D._TENSOR.size + 1 :])))
            if rng.random() < 0.2:
                bad = bad[: rng.integers(0, len(bad))]
            base = bytearray(prev.tobytes())
            try:
                D.apply(base, bytes(bad))
            except D.DeltaError:
                assert bytes(base) == prev.tobytes()


# ------------------------------------------------------------------------------------------ versions
def _manifest(chunk_bytes: int = 4096) -> Manifest:
    specs = {"embed": TensorSpec("bfloat16", (300, 64)), "norm": TensorSpec("float32", (64,)),
             "empty": TensorSpec("float32", (0,)), "proj": TensorSpec("float32", (64, 96))}
    return manifest_of(specs, chunk_bytes)


def _versions(m: Manifest, fracs=(0.01, 0.0, 0.0, 0.3), seed=0) -> tuple[bytes, bytes]:
    rng = np.random.default_rng(seed)
    prev, new = [], []
    for t, frac in zip(m.tensors, fracs, strict=True):
        a = _image(rng, t.nbytes // D.itemsize_of(t.dtype), t.dtype)
        prev.append(a.tobytes())
        new.append(_changed(rng, a, frac)[0].tobytes())
    return b"".join(prev), b"".join(new)


def _delta(m: Manifest, prev: bytes, new: bytes, algo: str = "xxh3_128") -> tuple[list[bytes], str, str]:
    base_digest = LazyDigests(m, prev, algo).version()  # what the full push computes
    digest = LazyDigests(m, new, algo).version()
    frames = DV.encode_version(m, prev, new, base_version=4, version=5, base_digest=base_digest, digest=digest,
                              algo=algo)
    return frames, base_digest, digest


@pytest.mark.parametrize("algo", ["xxh3_128", "sha256"])
def test_a_version_round_trips_to_the_full_pushs_digest(algo):
    m = _manifest()
    prev, new = _versions(m)
    frames, base_digest, digest = _delta(m, prev, new, algo)
    assert len(frames) == 1 + len(m.tensors)
    base = bytearray(prev)
    applied = DV.apply_version(m, base, frames, held_version=4, held_digest=base_digest)
    assert bytes(base) == new
    assert applied.version == 5 and applied.digest == digest
    assert list(applied.chunk_digests) == LazyDigests(m, new, algo).all()
    assert applied.changed == round(300 * 64 * 0.01) + round(64 * 96 * 0.3)
    assert applied.delta_bytes == sum(map(len, frames)) < 0.5 * len(new)
    assert [D.decode(f).mode for f in frames[1:]] == ["gaps", "gaps", "whole", "bitmap"]


def _version_refused(m, base: bytearray, frames, match: str, exc=D.DeltaError, **held) -> None:
    before = bytes(base)
    with pytest.raises(exc, match=match):
        DV.apply_version(m, base, frames, **held)
    assert bytes(base) == before


def test_a_delta_from_another_base_is_refused_before_anything_is_written():
    m = _manifest()
    prev, new = _versions(m)
    frames, base_digest, _ = _delta(m, prev, new)
    base = bytearray(prev)
    _version_refused(m, base, frames, "does not apply to the held version 3", D.DeltaBaseMismatch,
                     held_version=3, held_digest=base_digest)
    _version_refused(m, base, frames, "does not apply to the held version 4", D.DeltaBaseMismatch,
                     held_version=4, held_digest="sha256:" + "0" * 64)
    other = manifest_of({t.name: TensorSpec(t.dtype, t.shape) for t in m.tensors}, 1024)
    _version_refused(other, base, frames, "in 4096-byte chunks; the held version is .* in 1024-byte",
                     held_version=4, held_digest=base_digest)
    assert issubclass(D.DeltaBaseMismatch, WeightError) and D.DeltaBaseMismatch("x").kind == "precondition"


def test_a_truncated_or_shuffled_version_delta_is_refused_before_anything_is_written():
    m = _manifest()
    prev, new = _versions(m)
    frames, base_digest, _ = _delta(m, prev, new)
    held = dict(held_version=4, held_digest=base_digest)
    base = bytearray(prev)
    _version_refused(m, base, frames[:-1], "has 3 tensor frames of 4", **held)
    _version_refused(m, base, [frames[0], frames[2], frames[1], *frames[3:]], "the manifest has 'embed'", **held)
    _version_refused(m, base, [frames[0], *frames[1:-1], frames[-1][:-3]], "truncated or overlong", **held)
    _version_refused(m, base, [], "no version frame", **held)
    _version_refused(m, base, [frames[0][:-5], *frames[1:]], "version frame truncated", **held)
    _version_refused(m, bytearray(prev[:-4]), frames, "base buffer has", **held)
    with pytest.raises(D.DeltaError, match="read-only"):
        DV.apply_version(m, prev, frames, **held)


def test_a_result_with_another_digest_is_refused_as_neither_version():
    m = _manifest()
    prev, new = _versions(m)
    frames, base_digest, _ = _delta(m, prev, new)
    drifted = bytearray(prev)
    drifted[-1] ^= 0xFF  # a byte the delta does not rewrite differs from the publisher's base
    with pytest.raises(D.DeltaDigestMismatch, match="holds neither version; take a full version") as err:
        DV.apply_version(m, drifted, frames, held_version=4, held_digest=base_digest)
    assert err.value.kind == "integrity"


def test_a_delta_leads_to_a_newer_version_of_the_same_layout():
    m = _manifest()
    prev, new = _versions(m)
    with pytest.raises(D.DeltaError, match="newer version: 5 -> 5"):
        DV.encode_version(m, prev, new, base_version=5, version=5, base_digest="", digest="")
    with pytest.raises(D.DeltaError, match="new version has"):
        DV.encode_version(m, prev, new[:-4], base_version=4, version=5, base_digest="", digest="")


def test_the_version_frame_round_trips_and_refuses_an_unknown_digest():
    h = DV.DeltaHeader(4, 5, 4096, 3, "xxh3_128", "sha256:ab", "sha256:cd", "f" * 16)
    assert DV.decode_header(DV.encode_header(h)) == h
    bad = DV.encode_header(DV.DeltaHeader(4, 5, 4096, 3, "md5", "", "", ""))
    with pytest.raises(D.DeltaError, match="'md5', not one of"):
        DV.decode_header(bad)
    with pytest.raises(D.DeltaError, match="bytes after its header"):
        DV.decode_header(DV.encode_header(h) + b"\0")
    with pytest.raises(D.DeltaError, match="shorter than its 34-byte header"):
        DV.decode_header(DV.encode_header(h)[:20])
    with pytest.raises(D.DeltaError, match="not a delta frame"):
        DV.decode_header(struct.pack("<4s", D.MAGIC))
