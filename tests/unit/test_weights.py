import pytest
import torch

from services.common.weights import Chunk, WeightAssembler, WeightError, WeightStream, iter_chunks, specs_of


def state():
    torch.manual_seed(0)
    return {"a": torch.randn(100, 7), "b": torch.randn(3), "c": torch.zeros(0)}


def test_roundtrip_in_small_chunks():
    sd = state()
    chunks = list(iter_chunks(sd, version=3, chunk_bytes=64))
    assert sum(c.last for c in chunks) == 1 and chunks[-1].last and chunks[-1].digest
    asm = WeightAssembler(specs_of(sd), installed_version=2)
    for c in chunks:
        asm.add(c)
    version, out = asm.finish()
    assert version == 3
    for k in sd:
        assert torch.equal(out[k], sd[k])


def _feed(chunks, installed=0, specs=None):
    asm = WeightAssembler(specs or specs_of(state()), installed_version=installed)
    for c in chunks:
        asm.add(c)
    return asm.finish()


def _replace(chunk: Chunk, **kw) -> Chunk:
    return Chunk(**{**chunk.__dict__, **kw})


@pytest.mark.parametrize(
    "mutate, kind, match",
    [
        (lambda cs: [_replace(cs[0], name="zzz"), *cs[1:]], "argument", "unknown parameter"),
        (lambda cs: [_replace(cs[0], shape=(7, 100)), *cs[1:]], "argument", "expected dtype float32 shape"),
        (lambda cs: [_replace(cs[0], dtype="float16"), *cs[1:]], "argument", "float16"),
        (lambda cs: [*cs[:-1], _replace(cs[-1], digest="0" * 64)], "integrity", "digest mismatch"),
        (lambda cs: [cs[0], _replace(cs[1], data=b"x" + cs[1].data[1:]), *cs[2:]], "integrity", "digest mismatch"),
        (lambda cs: [cs[1], *cs], "argument", "offset"),
        (lambda cs: cs[:-2], "argument", "stream ended"),
    ],
)
def test_bad_streams_are_refused(mutate, kind, match):
    chunks = list(iter_chunks(state(), version=1, chunk_bytes=512))
    with pytest.raises(WeightError, match=match) as err:
        _feed(mutate(chunks))
    assert err.value.kind == kind


def test_old_version_is_refused():
    with pytest.raises(WeightError, match="not newer") as err:
        _feed(list(iter_chunks(state(), version=2, chunk_bytes=512)), installed=2)
    assert err.value.kind == "precondition"


def _stream(items, specs=None):
    return WeightStream(specs or specs_of(state()), iter(items))


def test_a_stream_drawn_into_a_blob_equals_the_state_dict_snapshot():
    from services.weights.values import snapshot_blob

    sd = state()
    drawn = []

    def tensors():  # one at a time, each a fresh copy (as a gather makes it)
        for name, t in sd.items():
            drawn.append(name)
            yield name, t.clone()

    from_stream = snapshot_blob(WeightStream(specs_of(sd), tensors()), 64, None)
    from_dict = snapshot_blob(sd, 64, None)
    assert drawn == list(sd) and from_stream.manifest == from_dict.manifest
    assert bytes(from_stream.blob.view) == bytes(from_dict.blob.view)


@pytest.mark.parametrize("items, match", [
    (lambda sd: [("b", sd["b"]), ("a", sd["a"]), ("c", sd["c"])], "gave b"),  # out of table order
    (lambda sd: [("a", sd["a"]), ("b", sd["b"][:2]), ("c", sd["c"])], "gave b"),  # wrong shape
    (lambda sd: [("a", sd["a"]), ("b", sd["b"].double()), ("c", sd["c"])], "gave b"),  # wrong dtype
    (lambda sd: [("a", sd["a"]), ("b", sd["b"])], "ended before 1 tensors"),  # short
])
def test_a_stream_that_breaks_its_own_table_is_refused(items, match):
    sd = state()
    with pytest.raises(WeightError, match=match):
        _stream(items(sd)).host_copies()


def test_a_relay_process_starts_without_torch():
    """The relays check manifests and place chunks by dtype name: importing torch would cost every
    relay process start ~3 s of CPU here (the fast tier starts about 30)."""
    import subprocess
    import sys
    from pathlib import Path

    code = "import sys, services.weights.__main__, services.weights.server; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "False"
