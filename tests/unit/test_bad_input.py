"""Regressions for what the fuzzing (``bench/fuzz_services.py``, ``bench/fuzz_files.py``) found, on the
pure pieces: each input below once crashed, wedged or silently confused a service or the CLI."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import pytest

from services.common.weights import MAX_CHUNKS, Manifest, TensorEntry, WeightError
from services.proto import braid_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]


def _manifest(nbytes: int, chunk_bytes: int) -> Manifest:
    return Manifest((TensorEntry("w", "float32", (nbytes // 4,), nbytes, 0),), chunk_bytes)


def test_a_version_of_too_many_chunks_is_refused_before_its_plan_is_built():
    _manifest(4 * MAX_CHUNKS, 4).validate()
    with pytest.raises(WeightError, match="chunks of 1 bytes: more than") as err:
        _manifest(1 << 30, 1).validate()  # a billion plan entries would take the relay's memory
    assert err.value.kind == "resource"


def test_the_store_refuses_a_version_larger_than_its_memory():
    from services.weights.store import VersionStore

    store = VersionStore(keep=2, shm_dir=None, max_version_bytes=1 << 20)
    store.begin(1, _manifest(1 << 20, 1 << 16))
    with pytest.raises(WeightError, match="at most 1048576 per version") as err:
        store.begin(2, _manifest(2 << 20, 1 << 16))
    assert err.value.kind == "resource" and sorted(store.incoming) == [1]
    store.close()


def test_a_nan_wait_is_refused_and_others_are_clamped():
    from services.weights.store import wait_limit

    assert wait_limit(-1.0, 600.0) == 0.0 and wait_limit(math.inf, 600.0) == 600.0 and wait_limit(2.5, 600.0) == 2.5
    with pytest.raises(WeightError, match="wait_s must be a number"):
        wait_limit(math.nan, 600.0)


@pytest.mark.parametrize("version,wait_s,ok", [(-1, 0.0, True), (7, 86400.0, True), (-2, 0.0, False),
                                               (0, math.nan, False), (0, -0.5, False), (0, math.inf, False)])
def test_pull_weights_requests_are_checked(version, wait_s, ok):
    from services.generation.server import pull_problem

    assert (pull_problem(pb.PullWeightsRequest(version=version, wait_s=wait_s)) is None) == ok


@pytest.mark.parametrize("branches,upstream,problem", [
    ([["127.0.0.1:5"], ["tls://relay-b:443"]], "127.0.0.1:6", None),
    ([[]], "", "every branch must name"),
    ([["no-port"]], "", "address must be host:port"),
    ([["127.0.0.1:0"]], "", "port of"),
    ([], "bad address", "address must be host:port"),
    ([["127.0.0.1:5"]] * 257, "", "branches; a relay forwards to at most"),
])
def test_chain_plans_are_checked(branches, upstream, problem):
    from services.weights.server import chain_problem

    why = chain_problem(pb.ChainRequest(branches=[pb.Branch(relays=b) for b in branches], upstream=upstream))
    assert why is None if problem is None else problem in why


@pytest.mark.parametrize("address", ["h:1", "[::1]:65535", "relay-a.example:443"])
def test_addresses_that_parse(address):
    from services.common.address import parse_address

    assert parse_address(address)[1] == int(address.rsplit(":", 1)[1])


@pytest.mark.parametrize("address", ["", ":80", "h:", "h:0", "h:65536", "h: 1", "h\x00:1", "h:\u0661",
                                     "a" * 300 + ":1"])
def test_addresses_that_do_not(address):
    from services.common.address import parse_address

    with pytest.raises(ValueError):
        parse_address(address)


def test_a_config_file_that_is_not_utf8_or_an_override_that_is_not_yaml_is_a_config_error(tmp_path):
    from services.common.config import ConfigError, load_config

    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"\x80model: {}\n")
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read it"):
        load_config(tmp_path)
    with pytest.raises(ConfigError, match="is not a YAML scalar"):
        load_config(None, ["generation.max_new_tokens=[1"])


@pytest.mark.parametrize("content", [b"null", b"[1, 2]", b'"model gen_gpus train_gpus gen_instances"', b"\xff{}"])
def test_an_allocation_plan_that_is_not_a_json_object_is_a_config_error(tmp_path, content):
    from flows.rl_training import load_plan
    from services.common.config import ConfigError

    path = tmp_path / "plan.json"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match="allocation plan"):
        load_plan(str(path))


def test_a_generation_log_of_another_shape_is_a_generation_log_error(tmp_path):
    from ranker.data import convert_log
    from ranker.genlog import GenerationLog, GenerationLogError, GenRecord

    path = tmp_path / "gen.sqlite"
    with GenerationLog(path) as log:
        log.append([GenRecord("p", "12", 3, 0, 0, 1.0)])
    with sqlite3.connect(path) as db:
        db.execute("ALTER TABLE generations RENAME COLUMN response_length TO length")
    with pytest.raises(GenerationLogError, match="not a readable generation log"):
        convert_log(path, tmp_path / "out.jsonl")


@pytest.mark.parametrize("column,value", [("prompt", b"\x00bytes"), ("response_length", "twelve"), ("prompt_id", b"p")])
def test_a_generation_log_row_of_the_wrong_types_is_a_generation_log_error(tmp_path, column, value):
    from ranker.data import convert_log
    from ranker.genlog import GenerationLog, GenerationLogError, GenRecord

    path = tmp_path / "gen.sqlite"
    with GenerationLog(path) as log:
        log.append([GenRecord("p", "12", 3, 0, 0, 1.0)])
    with sqlite3.connect(path) as db:
        db.execute(f"UPDATE generations SET {column} = ?", (value,))
    with pytest.raises(GenerationLogError, match="a row of the wrong types"):
        convert_log(path, tmp_path / "out.jsonl")


def test_ranker_parameters_that_do_not_fit_are_value_errors(tmp_path):
    from ranker.base import RankerFormatError, create, load_ranker

    with pytest.raises(ValueError, match="prompt_length ranker: parameters"):
        create("prompt_length", epochs=1)
    model = create("prompt_length")
    model.fit(["a", "bb", "ccc"], [1, 2, 3])
    saved = model.save(tmp_path / "r")
    manifest = json.loads((saved / "ranker.json").read_text())
    for field, value, match in (("params", {"epochs": 1}, "field 'params'"), ("train", 5, "field 'train'")):
        (saved / "ranker.json").write_text(json.dumps({**manifest, field: value}))
        with pytest.raises(RankerFormatError, match=match):
            load_ranker(saved)
    (saved / "ranker.json").write_text(json.dumps(manifest))
    (saved / "prompt_length.json").write_text("{}")
    with pytest.raises(RankerFormatError, match="damaged ranker"):
        load_ranker(saved)


def test_bytes_that_do_not_parse_get_invalid_argument_from_every_kind_of_method():
    """``MalformedRequests`` in front of a servicer: unary, server-streaming and client-streaming
    methods answer a request that does not parse with INVALID_ARGUMENT; good ones pass through."""
    from concurrent import futures

    import grpc

    from services.common.malformed import MalformedRequests
    from services.proto import braid_pb2_grpc as pb_grpc

    class Echo(pb_grpc.GenerationServicer):
        def Health(self, request, context):
            return pb.HealthReply(status="serving")

        def Generate(self, request, context):
            yield pb.Sample(prompt_id=request.prompts[0].prompt_id)

        def UpdateWeights(self, request_iterator, context):
            return pb.UpdateAck(tensors=sum(1 for _ in request_iterator))

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), interceptors=[MalformedRequests()])
    pb_grpc.add_GenerationServicer_to_server(Echo(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            health = ch.unary_unary("/braid.v1.Generation/Health")
            generate = ch.unary_stream("/braid.v1.Generation/Generate")
            update = ch.stream_unary("/braid.v1.Generation/UpdateWeights")
            assert pb.HealthReply.FromString(health(b"", timeout=5)).status == "serving"
            good = pb.GenerateRequest(prompts=[pb.Prompt(prompt_id="p")]).SerializeToString()
            assert pb.Sample.FromString(next(iter(generate(good, timeout=5)))).prompt_id == "p"
            assert pb.UpdateAck.FromString(update(iter([b"", b""]), timeout=5)).tensors == 2
            for call in (lambda: health(b"\xff", timeout=5), lambda: list(generate(b"\x0a\xff", timeout=5)),
                         lambda: update(iter([b"", b"\xff\xff"]), timeout=5)):
                with pytest.raises(grpc.RpcError) as err:
                    call()
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "malformed request to /braid.v1.Generation/" in err.value.details()
    finally:
        server.stop(0)


# mtime=0: the compressed bytes are the test's id, and pytest-xdist's workers must collect the same ids
@pytest.mark.parametrize("content", [b"not gzip at all", b"\x1f\x8b\x08\x00",
                                     __import__("gzip").compress(b"\xff\xfe\n", mtime=0)],
                         ids=["not gzip", "header cut short", "not UTF-8"])
def test_an_mmlu_source_that_is_not_gzip_or_is_cut_short_is_a_data_error(tmp_path, content):
    from ranker.data import DataError, convert_mmlu

    path = tmp_path / "src.jsonl.gz"
    path.write_bytes(content)
    with pytest.raises(DataError, match="unreadable"):
        convert_mmlu(path, tmp_path / "out")
