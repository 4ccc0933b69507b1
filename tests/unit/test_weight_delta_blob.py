"""A delta version as the weight plane carries it (``delta_blob``), a relay's store taking one onto a
held base, the publisher's cast to the wire dtype, and the config's refusals."""

from __future__ import annotations

import pytest
import torch

from services.common.weights import Manifest, WeightError, WeightStream, blob_chunk, chunk_digest, version_digest
from services.weights import delta as D
from services.weights import delta_blob as DB
from services.weights import delta_version as DV
from services.weights.store import VersionStore
from services.weights.values import snapshot_blob

CHUNK = 1 << 16


def _states(seed: int = 0, moved: float = 1e-3) -> tuple[dict, dict]:
    gen = torch.Generator().manual_seed(seed)
    a = {"w": torch.randn(600, 256, generator=gen), "b": torch.randn(77, generator=gen)}
    return a, {k: v + moved * torch.randn(v.shape, generator=gen) for k, v in a.items()}


def _held(wb, version: int) -> DB.Held:
    enc = DB.encode(wb.manifest, wb.blob.view, version=version, base=None, algo="xxh3_128")
    assert enc.delta is None and enc.delta_bytes == 0
    return DB.Held(version, wb.manifest, wb.blob.view, enc.digest, wb.blob)


def test_a_bf16_step_goes_as_a_small_delta_that_rebuilds_the_same_bits():
    s1, s2 = _states()
    w1, w2 = snapshot_blob(s1, CHUNK, None, dtype="bfloat16"), snapshot_blob(s2, CHUNK, None, dtype="bfloat16")
    assert {t.dtype for t in w2.manifest.tensors} == {"bfloat16"}
    base = _held(w1, 1)
    before = bytes(w1.blob.view)
    enc = DB.encode(w2.manifest, w2.blob.view, version=2, base=base, algo="xxh3_128")
    assert enc.delta is not None and enc.delta_bytes == enc.delta.manifest.total_bytes < 0.5 * w2.manifest.total_bytes
    assert enc.digest == DV.version_digests(w2.manifest, w2.blob.view)[1]
    assert [t.name for t in enc.delta.manifest.tensors] == ["delta.header", "delta.0", "delta.1"]
    out = bytearray(w2.manifest.total_bytes)
    applied = DB.materialize(base, enc.delta.manifest, enc.delta.blob.view, out)
    assert applied.version == 2 and applied.digest == enc.digest and bytes(out) == bytes(w2.blob.view)
    assert bytes(w1.blob.view) == before  # the held base is never written


def test_a_delta_not_below_the_share_is_not_sent():
    s1, _ = _states()
    s2 = {k: torch.randn(v.shape) for k, v in s1.items()}  # every float32 value moved far: no delta pays
    w1, w2 = snapshot_blob(s1, CHUNK, None), snapshot_blob(s2, CHUNK, None)
    enc = DB.encode(w2.manifest, w2.blob.view, version=2, base=_held(w1, 1), algo="xxh3_128")
    assert enc.delta is None and enc.delta_bytes >= DB.MAX_SHARE * w2.manifest.total_bytes
    other = snapshot_blob({"w": torch.zeros(3)}, CHUNK, None)  # a base of another layout: no delta either
    assert DB.encode(w2.manifest, w2.blob.view, version=2, base=_held(other, 1), algo="xxh3_128").delta is None


def test_delta_layouts_and_buffers_are_checked():
    with pytest.raises(WeightError, match=r"uint8 frames named delta\.header"):
        DB.check_layout(snapshot_blob({"w": torch.zeros(4)}, CHUNK, None).manifest)
    with pytest.raises(WeightError, match="at least its version frame"):
        DB.check_layout(Manifest((), CHUNK))
    s1, s2 = _states()
    w1, w2 = snapshot_blob(s1, CHUNK, None, dtype="bfloat16"), snapshot_blob(s2, CHUNK, None, dtype="bfloat16")
    enc = DB.encode(w2.manifest, w2.blob.view, version=2, base=_held(w1, 1), algo="xxh3_128")
    with pytest.raises(WeightError, match="byte buffer for a"):
        DB.materialize(_held(w1, 1), enc.delta.manifest, enc.delta.blob.view, bytearray(10))
    with pytest.raises(D.DeltaBaseMismatch):
        DB.materialize(_held(w1, 7), enc.delta.manifest, enc.delta.blob.view, bytearray(w1.manifest.total_bytes))


def _push(store: VersionStore, version: int, wb, base: int | None = None) -> bool:
    inc = store.begin(version, wb.manifest, delta_base=base)
    last = -1
    for ref in wb.manifest.plan:
        d = chunk_digest(wb.blob.view[ref.blob_offset : ref.blob_offset + ref.length], "xxh3_128")
        store.add(inc, blob_chunk(wb.manifest, wb.blob.view, ref, version, d), 0, 1, last)
        last = ref.index
    store.set_digest(inc, version_digest(list(inc.digests)))
    return store.try_commit(inc)


def test_a_store_takes_a_delta_only_onto_its_base_and_commits_the_full_version(tmp_path):
    s1, s2 = _states(1)
    w1, w2 = snapshot_blob(s1, CHUNK, None, dtype="bfloat16"), snapshot_blob(s2, CHUNK, None, dtype="bfloat16")
    base = _held(w1, 1)
    enc = DB.encode(w2.manifest, w2.blob.view, version=2, base=base, algo="xxh3_128")
    store = VersionStore(1, tmp_path)
    with pytest.raises(WeightError, match="base version 1 is not held") as err:
        store.begin(2, enc.delta.manifest, delta_base=1)
    assert err.value.kind == "precondition"
    assert _push(store, 1, w1)
    with pytest.raises(WeightError, match="delta leads to a newer version"):
        store.begin(1, enc.delta.manifest, delta_base=1)
    assert _push(store, 2, enc.delta, base=1)
    s = store.committed[2]
    assert s.digest == enc.digest and bytes(s.blob.view) == bytes(w2.blob.view) and s.manifest == w2.manifest
    assert s.source(1, base.digest) is s.delta and s.source(1, "other") is s and s.source(0, base.digest) is s
    assert store.held() == [2]  # keep 1: the base was evicted, the new version holds its own delta
    files = sorted(tmp_path.iterdir())
    assert len(files) == 2  # the full version and its delta
    store.close()
    assert not list(tmp_path.iterdir())


def test_a_delta_to_another_digest_is_refused_and_nothing_of_it_kept(tmp_path):
    s1, s2 = _states(2)
    w1, w2 = snapshot_blob(s1, CHUNK, None, dtype="bfloat16"), snapshot_blob(s2, CHUNK, None, dtype="bfloat16")
    base = _held(w1, 1)
    frames = DV.encode_version(w2.manifest, w1.blob.view, w2.blob.view, base_version=1, version=2,
                              base_digest=base.digest, digest="f" * 64)  # claims a digest it does not lead to
    bad = DB.pack(frames, CHUNK)
    store = VersionStore(2, None)
    assert _push(store, 1, w1)
    with pytest.raises(D.DeltaDigestMismatch):
        _push(store, 2, bad, base=1)
    assert store.held() == [1] and not store.incoming and store.committed[1].pins == 0


def test_the_publisher_casts_floating_tensors_to_the_wire_dtype():
    state = {"w": torch.ones(2, 3), "steps": torch.arange(4)}
    stream = WeightStream.of(state).cast("bfloat16")
    assert {n: s.dtype for n, s in stream.specs.items()} == {"w": "bfloat16", "steps": "int64"}
    got = dict(stream.checked())
    assert got["w"].dtype == torch.bfloat16 and torch.equal(got["steps"], state["steps"])
    assert WeightStream.of(state).cast("float32").specs == WeightStream.of(state).specs


@pytest.mark.parametrize(("overrides", "match"), [
    (["weights.delta=true", "weights.transport=direct"], "weights.delta needs weights.transport: relay"),
    (["weights.dtype=bfloat16", "generation.engine=hf"], "needs generation.engine: vllm"),
])
def test_the_config_refuses_delta_settings_that_cannot_work(overrides, match):
    from services.common.config import ConfigError, load_config
    from tests.conftest import ROOT

    with pytest.raises((ConfigError, ValueError), match=match):
        load_config(ROOT / "deploy/configs/smoke.yaml", overrides)



def _chain(n: int, seed: int = 3, step: float = 2e-3):
    """``n`` bf16 versions ``step`` apart, each pushed into a store as the delta from the one before."""
    gen = torch.Generator().manual_seed(seed)
    state = {"w": torch.randn(400, 128, generator=gen), "b": torch.randn(33, generator=gen)}
    store, wbs = VersionStore(n, None), []
    base = None
    for v in range(1, n + 1):
        wb = snapshot_blob(state, CHUNK, None, dtype="bfloat16")
        enc = DB.encode(wb.manifest, wb.blob.view, version=v, base=base, algo="xxh3_128")
        assert _push(store, v, enc.delta if base else wb, base=base.version if base else None)
        base, state = DB.Held(v, wb.manifest, wb.blob.view, enc.digest, wb.blob), {
            k: t + step * torch.randn(t.shape, generator=gen) for k, t in state.items()}
        wbs.append(base)
    return store, wbs


def test_a_chain_of_deltas_composes_into_one_that_rebuilds_the_last_version():
    from services.weights.delta_log import DeltaLog

    store, held = _chain(4)
    log = DeltaLog(keep=8)
    for v in (2, 3, 4):
        log.add(store.committed[v])
    full = store.committed[4]
    composed = log.for_puller(full, 1, held[0].digest)
    assert composed is not full and composed is not full.delta and composed.manifest.tensors[0].name == "delta.header"
    assert log.for_puller(full, 1, held[0].digest) is composed  # made once per (held, wanted) version
    assert log.for_puller(full, 3, held[2].digest) is full.delta  # one behind: the delta it arrived as
    assert log.for_puller(full, 1, "sha256:" + "0" * 64) is full  # another version 1: no chain from it
    out = bytearray(full.manifest.total_bytes)
    applied = DB.materialize(held[0], composed.manifest, composed.blob.view, out)
    assert applied.version == 4 and applied.digest == full.digest and bytes(out) == bytes(full.blob.view)
    assert composed.digest == version_digest(list(composed.digests))
    log.forget({5})  # version 4 no longer held: its composed deltas go
    assert log.for_puller(full, 1, held[0].digest) is not composed


def test_a_chain_that_does_not_follow_on_is_refused_and_the_log_keeps_its_newest():
    from services.weights.delta_log import DeltaLog

    store, held = _chain(4, seed=4)
    full = store.committed[4]
    frames = [DB.frames_of(store.committed[v].delta.manifest, store.committed[v].delta.blob.view) for v in (2, 4)]
    with pytest.raises(D.DeltaError, match="do not follow on"):
        DV.compose(full.manifest, full.blob.view, frames)
    with pytest.raises(D.DeltaError, match="empty chain"):
        DV.compose(full.manifest, full.blob.view, [])
    log = DeltaLog(keep=2)
    for v in (2, 3, 4):
        log.add(store.committed[v])
    assert log.chain(1, held[0].digest, full) is None  # 1 -> 2 fell out of the log
    assert [e.version for e in log.chain(2, held[1].digest, full)] == [3, 4]
    assert log.logged()[0] == [3, 4]
    big, _ = _chain(4, seed=4, step=3e-2)  # deltas of ~43% of a version: two fit in one version's bytes, not three
    small = DeltaLog(keep=16)
    for v in (2, 3, 4):
        small.add(big.committed[v])
    versions, nbytes = small.logged()
    assert versions == [3, 4] and nbytes <= big.committed[4].manifest.total_bytes
