"""Pure parts of the weight plane: the broadcast plan, the version store, the wire encoding."""

from __future__ import annotations

import threading

import pytest
import torch

from services.common.weights import (
    WeightError,
    blob_chunk,
    chunk_digest,
    manifest_of,
    state_from_blob,
    version_digest,
)
from services.proto import braid_pb2 as pb
from services.weights.chain import RelayNode, choose_master, cross_site_copies, plan_broadcast, relink
from services.weights.client import snapshot_blob
from services.weights.store import VersionStore
from services.weights.wire import decode, encode_chunk


# ---------------------------------------------------------------- chain scheduler
def _nodes(spec: dict[str, list[str]], dead: set[str] = frozenset()) -> list[RelayNode]:
    return [RelayNode(r, site, r not in dead) for site, relays in spec.items() for r in relays]


def test_single_site_plan_is_one_chain_from_the_master():
    plan = plan_broadcast(_nodes({"a": ["m", "r1", "r2", "r3"]}), "m")
    assert plan.order() == ["m", "r1", "r2", "r3"]
    assert plan.branches["m"] == [["r1", "r2", "r3"]] and plan.branches["r1"] == [["r2", "r3"]]
    assert plan.branches["r3"] == [] and plan.upstream == {"r1": "m", "r2": "r1", "r3": "r2"}


def test_cross_site_plan_sends_one_copy_per_site_link_then_fans_out_locally():
    nodes = _nodes({"train": ["m", "t1"], "gen-a": ["a1", "a2", "a3"], "gen-b": ["b1", "b2"]})
    plan = plan_broadcast(nodes, "m")
    site_of = {n.relay_id: n.site for n in nodes}
    assert cross_site_copies(plan, site_of) == {("train", "gen-a"): 1, ("train", "gen-b"): 1}
    assert plan.branches["m"] == [["t1"], ["a1", "a2", "a3"], ["b1", "b2"]]
    assert set(plan.order()) == set(site_of)


def test_dead_relays_are_cut_out_and_the_master_replaced_on_the_training_site():
    nodes = _nodes({"train": ["m", "t1"], "gen": ["g1", "g2"]}, dead={"m", "g1"})
    master = choose_master(nodes, "train", current="m")
    assert master == "t1"
    plan = plan_broadcast(nodes, master)
    assert plan.order() == ["t1", "g2"]
    assert choose_master(nodes, "train", current="g2") == "g2"  # a live master stays
    assert choose_master(_nodes({"train": ["m"], "gen": ["g"]}, dead={"m"}), "train", None) == "g"
    assert choose_master(_nodes({"train": ["m"]}, dead={"m"}), "train", None) is None
    assert relink(["r1", "r2", "r3"], {"r1"}) == ["r2", "r3"]
    with pytest.raises(ValueError, match="not a live relay"):
        plan_broadcast(nodes, "m")


def test_remote_addresses_are_used_across_sites_only():
    n = RelayNode("127.0.0.1:5", "gen", True, "tls://10.0.0.2:6")
    assert n.address_for("gen") == "127.0.0.1:5" and n.address_for("train") == "tls://10.0.0.2:6"


# ---------------------------------------------------------------- version store
def _state(fill: float) -> dict[str, torch.Tensor]:
    return {"a": torch.full((300,), fill), "b": torch.full((7, 3), fill), "c": torch.zeros(0)}


def _chunks(state, version, chunk_bytes=256):
    wb = snapshot_blob(state, chunk_bytes, None)
    m = wb.manifest
    ds = [chunk_digest(wb.blob.view[r.blob_offset : r.blob_offset + r.length]) for r in m.plan]
    return m, [blob_chunk(m, wb.blob.view, r, version, ds[r.index]) for r in m.plan], version_digest(ds)


def _push(store, state, version, parts=1):
    m, chunks, vd = _chunks(state, version)
    inc = store.begin(version, m)
    for part in range(parts):
        last = -1
        for c in chunks:
            if c.index % parts == part:
                store.add(inc, c, part, parts, last)
                last = c.index
    store.set_digest(inc, vd)
    assert store.try_commit(inc)


def test_store_keeps_k_versions_and_a_pinned_version_outlives_eviction():
    store = VersionStore(keep=2, shm_dir=None)
    _push(store, _state(1.0), 1, parts=2)
    with store.pinned(1) as s1:
        _push(store, _state(2.0), 2)
        _push(store, _state(3.0), 3)
        assert store.held() == [2, 3] and s1.evicted
        assert torch.equal(state_from_blob(s1.manifest, s1.blob.view)["a"], torch.full((300,), 1.0))
    with pytest.raises(WeightError, match=r"versions held: \[2, 3\]") as err, store.pinned(1):
        pass
    assert err.value.kind == "not_found"


def test_an_evicted_version_is_freed_on_the_reaper_thread_not_in_the_commit(tmp_path):
    import threading
    import weakref

    store = VersionStore(keep=1, shm_dir=tmp_path)
    _push(store, _state(1.0), 1)
    with store.pinned(1) as s1:
        path = s1.blob.path
    freed = threading.Event()
    freed_on: list[str] = []
    weakref.finalize(s1, lambda: (freed_on.append(threading.current_thread().name), freed.set()))
    del s1
    _push(store, _state(2.0), 2)  # commits 2, evicts 1
    assert store.held() == [2] and not path.exists()  # its file goes at once
    assert freed.wait(5) and freed_on == ["relay-reaper"]  # its memory goes off the commit's thread
    store.close()


def test_an_arriving_version_is_invisible_until_committed():
    store = VersionStore(keep=2, shm_dir=None)
    _push(store, _state(1.0), 1)
    m, chunks, vd = _chunks(_state(2.0), 2)
    inc = store.begin(2, m)
    for c in chunks[:-1]:
        store.add(inc, c, 0, 1, c.index - 1)
    with store.pinned(-1) as s:
        assert s.version == 1  # latest is still the complete one
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(_pinned_version(store, 2)))
    waiter.start()
    store.add(inc, chunks[-1], 0, 1, chunks[-1].index - 1)
    assert not store.try_commit(inc)  # no version digest yet
    store.set_digest(inc, vd)
    assert store.try_commit(inc)
    waiter.join(5)
    assert got == [2]


def _pinned_version(store, v):
    with store.pinned(v, wait_s=5) as s:
        return s.version


@pytest.mark.parametrize(
    "edit, kind, match",
    [
        (lambda cs: [cs[1]], "argument", "out of order or duplicated"),  # stream's previous index was 1
        (lambda cs: [_with(cs[0], index=99)], "argument", "out of range"),
        (lambda cs: [_with(cs[0], name="b")], "argument", "the manifest says"),
        (lambda cs: [_with(cs[0], data=b"x" * len(cs[0].data))], "integrity", "digest mismatch"),
        (lambda cs: [_with(cs[0], chunk_digest="md5:00")], "argument", "algo:hex"),
        (lambda cs: [_with(cs[0], version=7)], "argument", "version 7"),
    ],
)
def test_store_refuses_bad_chunks(edit, kind, match):
    store = VersionStore(keep=2, shm_dir=None)
    m, chunks, _ = _chunks(_state(1.0), 1)
    inc = store.begin(1, m)
    with pytest.raises(WeightError, match=match) as err:
        for c in edit(chunks):
            store.add(inc, c, 0, 1, 1 if match.startswith("out of order") else -1)
    assert err.value.kind == kind


def test_store_refuses_other_models_older_versions_and_duplicates():
    store = VersionStore(keep=2, shm_dir=None)
    _push(store, _state(1.0), 3)
    with pytest.raises(WeightError, match="different model") as err:
        store.begin(4, manifest_of({"z": torch.zeros(3)}, 256))
    assert err.value.kind == "precondition"
    with pytest.raises(WeightError, match="older than the newest held version 3"):
        store.begin(2, manifest_of(_state(0.0), 256))
    with pytest.raises(WeightError, match="already held") as err:
        store.begin(3, manifest_of(_state(0.0), 256))
    assert err.value.kind == "exists"
    m, chunks, _ = _chunks(_state(4.0), 4)
    inc = store.begin(4, m)
    store.add(inc, chunks[0], 0, 1, -1)
    with pytest.raises(WeightError, match="duplicated"):
        store.add(inc, chunks[0], 0, 1, -1)  # a second stream sending the same chunk


def _with(chunk, **kw):
    return type(chunk)(**{**chunk.__dict__, **kw})


# ---------------------------------------------------------------- wire encoding
def test_zero_copy_chunk_encoding_is_plain_protobuf():
    _, chunks, _ = _chunks(_state(1.5), 9)
    c = chunks[1]
    raw = encode_chunk(c, c.data)
    parsed = pb.PushMessage.FromString(raw)  # any protobuf peer reads it
    assert parsed.chunk.data == bytes(c.data) and parsed.chunk.index == 1 and parsed.chunk.name == c.name
    msg, data = decode(pb.PushMessage, raw)
    assert bytes(data) == bytes(c.data) and msg.chunk.chunk_digest == c.chunk_digest and msg.chunk.data == b""
    full = pb.PushMessage(chunk=pb.WeightChunk(version=2, name="x", data=b"abc", index=4),
                          part=1, parts=3).SerializeToString()
    msg, data = decode(pb.PushMessage, full)  # a peer's ordinary encoding (data field not last)
    assert bytes(data) == b"abc" and msg.chunk.index == 4 and msg.parts == 3
    msg, data = decode(pb.PushMessage, pb.PushMessage(version_digest="sha256:ab").SerializeToString())
    assert data is None and msg.version_digest == "sha256:ab"


def test_private_shm_dirs_of_dead_processes_are_removed(tmp_path):
    import os

    from services.weights.blob import private_shm_dir

    dead = tmp_path / "braid-relay-999999999"  # no such pid
    dead.mkdir()
    (dead / "braid-x.blob").write_bytes(b"x")
    alive = tmp_path / f"braid-relay-{os.getppid()}"
    alive.mkdir()
    mine = private_shm_dir("relay", root=tmp_path)
    assert mine == tmp_path / f"braid-relay-{os.getpid()}" and mine.is_dir()
    assert not dead.exists() and alive.exists()
