"""The value codings of a delta frame (``services.weights.delta_values``): every coding round trips
ulp moves, sign flips, NaN and inf bit for bit; the encoder picks the smaller coding; malformed
varint streams and misplaced sections are refused with a delta error."""

from __future__ import annotations

import numpy as np
import pytest

from services.weights import delta as D
from services.weights import delta_values as V
from tests.unit.test_weight_delta import ITEMSIZE, _image, _refused, _reheader


def _special(dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Pairs of bit patterns a float can move between: +/-1 ulp, sign flips (0 and -0, x and -x), into and
    out of NaN and inf, the largest patterns (wrapping modulo the width), and random changes."""
    u = np.uint32 if dtype == "float32" else np.uint16
    top = 0 if dtype == "float32" else 16
    bits = lambda *xs: (np.array(xs, dtype=np.float32).view(np.uint32) >> top).astype(u)  # noqa: E731
    rng = np.random.default_rng(3)
    base = _image(rng, 64, dtype)
    old = np.concatenate([base, base, base, bits(0.0, -0.0, 1.5, np.inf, -np.inf, np.nan, 1.0, 0.0),
                          np.array([0, np.iinfo(u).max, 1 << (8 * np.dtype(u).itemsize - 1)], dtype=u),
                          rng.integers(0, np.iinfo(u).max, 64, dtype=u, endpoint=True)])
    new = np.concatenate([base + 1, base - 1, base ^ u(1 << (8 * np.dtype(u).itemsize - 1)),  # sign flips
                          bits(-0.0, 0.0, -1.5, np.nan, np.inf, 1.0, np.inf, np.nan),
                          np.array([np.iinfo(u).max, 0, (1 << (8 * np.dtype(u).itemsize - 1)) - 1], dtype=u),
                          rng.integers(0, np.iinfo(u).max, 64, dtype=u, endpoint=True)])
    return old, new


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("coding", V.CODINGS)
@pytest.mark.parametrize("level", [0, 1])
@pytest.mark.parametrize("spread", [1, 40])  # 1: whole or bitmap; 40: far apart, gaps
def test_every_value_coding_round_trips_ulps_sign_flips_nan_inf_and_random_changes(dtype, coding, level, spread):
    old, new = _special(dtype)
    prev = np.zeros(len(old) * spread, dtype=old.dtype)
    prev[::spread] = old
    after = prev.copy()
    after[::spread] = new
    frame = D.encode(prev.tobytes(), after.tobytes(), ITEMSIZE[dtype], level=level, codings=(coding,))
    d = D.decode(frame)
    assert d.coding == coding and d.mode == ("gaps" if spread == 40 else "whole")
    base = bytearray(prev.tobytes())
    assert D.apply(base, frame) == int(np.count_nonzero(prev != after))
    assert bytes(base) == after.tobytes()


@pytest.mark.parametrize("itemsize", [1, 2, 4, 8])
def test_zigzag_differences_are_small_for_small_moves_and_invert_modulo_the_width(itemsize):
    u = V.UINT[itemsize]
    top = np.iinfo(u).max
    old = np.array([5, 5, 5, 0, top, 0, top, 1 << (8 * itemsize - 1)], dtype=u)
    new = np.array([5, 6, 4, 1, 0, top, top - 1, 0], dtype=u)
    zz = V.zigzag_diff(old, new)
    assert zz[:7].tolist() == [0, 2, 1, 2, 2, 1, 1]  # 0, +1, -1, +1, +1 (wraps), -1 (wraps), -1
    assert V.unzigzag_add(old, zz).tolist() == new.tolist()
    rng = np.random.default_rng(itemsize)
    a, b = (rng.integers(0, top, 10_000, dtype=u, endpoint=True) for _ in range(2))
    assert (V.unzigzag_add(a, V.zigzag_diff(a, b)) == b).all()
    varints = V.encode_varints(V.zigzag_diff(a, b))
    back = V.decode_varints(np.frombuffer(varints, np.uint8), 10_000, V.varint_max_len(8 * itemsize), 8 * itemsize)
    assert (back == V.zigzag_diff(a, b)).all()


def _ulp_moves(n: int, frac: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A bf16 image and the same with ``frac`` of it moved by +/-1 ulp, as an optimizer step does."""
    rng = np.random.default_rng(seed)
    prev = _image(rng, n, "bfloat16")
    new = prev.copy()
    pos = rng.choice(n, round(n * frac), replace=False)
    new[pos] += np.where(rng.random(len(pos)) < 0.5, 1, -1).astype(np.uint16)
    return prev, new


@pytest.mark.parametrize(("frac", "level"), [(0.07, 0), (0.07, 1), (0.3, 1), (1.0, 1)])
def test_a_difference_coding_is_chosen_when_it_is_smaller(frac, level):
    prev, new = _ulp_moves(200_000, frac)
    planes = D.encode(prev.tobytes(), new.tobytes(), 2, level=level, codings=("planes",))
    frame = D.encode(prev.tobytes(), new.tobytes(), 2, level=level)
    d = D.decode(frame)
    assert d.coding != "planes"
    assert len(frame) < 0.8 * len(planes)
    if level == 0:  # raw sizes: a +/-1 difference is one varint byte where planes take two
        assert d.coding == "diff_varints" and d.raw_bytes - d.index_bytes == d.changed
    base = bytearray(prev.tobytes())
    D.apply(base, frame)
    assert bytes(base) == new.tobytes()


def test_planes_stay_chosen_when_differences_do_not_help():
    rng = np.random.default_rng(5)
    prev = rng.integers(0, 1 << 16, 50_000, dtype=np.uint16)
    new = prev.copy()
    new[::3] = 0x3F80  # every changed value the same: planes deflate to nothing, differences do not
    d = D.decode(D.encode(prev.tobytes(), new.tobytes(), 2))
    assert d.coding == "planes" and d.compressed


def _varint_frame(payload: bytes, changed: int, index_bytes: int, count: int = 1000, **fields) -> bytes:
    """A gaps + diff_varints frame for a ``count``-element bf16 tensor with ``payload`` (not deflated)."""
    prev = np.zeros(count, dtype=np.uint16)
    new = prev.copy()
    new[[3, 10]] = [1, 0xFFFF]
    frame = D.encode(prev.tobytes(), new.tobytes(), 2, level=0, codings=("diff_varints",))
    return _reheader(frame, payload=payload, changed=changed, index_bytes=index_bytes, raw=len(payload), **fields)


@pytest.mark.parametrize(("payload", "changed", "index_bytes", "match"), [
    (b"\x03\x06" + b"\x02\x01", 2, 2, None),  # the well-formed one: +1 at 3, -1 at 10
    (b"\x03\x06" + b"\x82\x81", 2, 2, "value section holds 0 complete varints"),  # never terminated
    (b"\x03\x06" + b"\x02\x80\x80\x80\x01", 2, 2, "value varint of 4 bytes: longer than 3"),  # 16 bits need 3
    (b"\x03\x06" + b"\x02\xff\xff\x07", 2, 2, "value varint overflows 16 bits"),  # 2**21 - 1
    (b"\x03\x06" + b"\x02\x00", 2, 2, "1 nonzero differences for 2 changed"),  # a changed element left alone
    (b"\x03\x86" + b"\x02\x01", 2, 2, "index section holds 1 complete varints"),  # gap varint runs into values
    (b"\xe8\x07\x00" + b"\x02\x01", 2, 3, "index gap 1000 out of range"),  # of 1000 elements
    (b"\x03\x06\x01" + b"\x02\x01", 2, 3, "index section holds 3 complete varints"),  # one gap too many
])
def test_a_malformed_varint_stream_is_refused_with_a_delta_error(payload, changed, index_bytes, match):
    frame = _varint_frame(payload, changed, index_bytes)
    base = bytearray(np.zeros(1000, dtype=np.uint16).tobytes())
    if match is None:
        assert D.apply(base, frame) == 2
        assert np.frombuffer(base, np.uint16)[[3, 10]].tolist() == [1, 0xFFFF]
    else:
        _refused(base, frame, match)


def test_an_unknown_value_coding_or_a_misplaced_section_is_refused():
    frame = _varint_frame(b"\x03\x06\x02\x01", 2, 2)
    base = bytearray(2000)
    _refused(base, _reheader(frame, coding=3), "unknown mode 0, value coding 3")
    _refused(base, _reheader(frame, index_bytes=5), "cannot hold 2 of 1000")
    _refused(base, _reheader(frame, index_bytes=1 << 40), "cannot hold 2 of 1000")
    _refused(base, _reheader(frame, coding=2), "cannot hold")  # 2 bytes cannot be two 2-byte planes


@pytest.mark.parametrize("coding", V.CODINGS)
def test_a_fuzzed_frame_of_every_coding_raises_a_delta_error_or_applies(coding):
    rng = np.random.default_rng(11)
    prev, new = _ulp_moves(2000, 0.05)
    for level in (0, 6):
        frame = D.encode(prev.tobytes(), new.tobytes(), 2, name="w", level=level, codings=(coding,))
        for _ in range(150):
            bad = bytearray(frame)
            for i in rng.integers(D._TENSOR.size + 1, len(bad), rng.integers(1, 4)):
                bad[i] = int(rng.integers(0, 256))
            bad = _reheader(bytes(bad), payload=bytes(bad[D._TENSOR.size + 1 :]))  # past the checksum
            base = bytearray(prev.tobytes())
            try:
                D.apply(base, bad)
            except D.DeltaError:
                assert bytes(base) == prev.tobytes()


def test_gap_bytes_counted_a_chunk_at_a_time_match_the_whole_count():
    pos = np.sort(np.random.default_rng(2).choice(100_000, 3000, replace=False))
    whole = int(V.varint_lengths(D._gaps(pos)).sum())
    assert [D._gap_bytes(pos, chunk) for chunk in (7, 1000, 1 << 22)] == [whole] * 3
    assert D._gap_bytes(pos[:0]) == 0
