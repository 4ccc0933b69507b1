"""Property-based fuzzing of Braid's gRPC services (issue 20 item 5): strategies, the stack, the properties.

Shared by ``tests/integration/test_fuzz_services.py`` (a few examples per method, in ``make test``)
and ``bench/fuzz.py`` (many, for the record). The stack is the real thing on loopback, started by
the launcher's own code (``flows.processes``): a weight relay, an SGS instance (hf engine, the
tiny checkpoint) pulling from it, and the SGS router over that instance.

Every method of ``braid.proto`` is sent two kinds of input: protobuf messages built by hypothesis
(well-formed but wrong: huge, negative, NaN and infinite numbers, empty and oversized strings,
token ids outside the vocabulary, old/current/future weight versions; and weight streams made
from a good version by mutations: truncated, reordered, duplicated, corrupted chunks, wrong names,
dtypes, shapes, offsets, digests, indices, manifests), and raw random bytes through a generic call
(``bytes`` variant). The property, per example:

- the reply is OK or a status from the method's allowed set (never UNKNOWN or INTERNAL: those are
  an unhandled exception or a framework failure), and a refusal says why (non-empty details);
- a wait (DEADLINE_EXCEEDED) only where the caller asked for one (a future ``min_weight_version``,
  a relay pull of a version not held yet with a wait longer than the call's deadline);
- afterwards every process is alive and answers Health / Versions.

After a method's examples, ``check_nothing_lost`` pulls every version the relay holds and checks
it byte-exact against the good weights (a refused push never touches a committed version; a
mutated push that is accepted can only be the good bytes under another version number), pushes
and pulls a fresh version, and has the SGS and the router generate greedily with the same tokens
as before the fuzzing (the installed weights are still the good ones).
"""

from __future__ import annotations

import json
import math
import time
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from services.proto import braid_pb2 as pb

ROOT = Path(__file__).resolve().parents[1]
OK = "OK"
CRASH_CODES = ("UNKNOWN", "INTERNAL")
CALL_TIMEOUT_S = 10.0
CHUNK_BYTES = 4096  # the tiny model's version in ~20 chunks: mutations have room
MESSAGE_MB = 4
OVERRIDES = [
    "generation.engine=hf", "generation.max_new_tokens=8", "generation.max_sequences_per_request=16",
    "generation.max_prompt_tokens=64", "generation.forced_lengths=true", "generation.num_blocks=64",
    f"generation.max_message_mb={MESSAGE_MB}", "weights.pull_wait_s=1.0", "weights.sgs_auto_pull_s=0",
    "generation.dispatch.policy=round_robin",
]

_W = ("INVALID_ARGUMENT", "FAILED_PRECONDITION", "DATA_LOSS", "RESOURCE_EXHAUSTED")
GEN = {
    "Generate": {OK, "INVALID_ARGUMENT", "FAILED_PRECONDITION", "DEADLINE_EXCEEDED"},
    "UpdateWeights": {OK, *_W},
    "Health": {OK},
    "PullWeights": {OK, *_W, "NOT_FOUND"},
}
ALLOWED = {
    "sgs": {**GEN, "AddInstance": {"UNIMPLEMENTED"}, "RemoveInstance": {"UNIMPLEMENTED"},
            "Interrupt": {OK, "INVALID_ARGUMENT"}},
    "router": {
        **GEN,
        "AddInstance": {OK, "INVALID_ARGUMENT", "ALREADY_EXISTS", "UNAVAILABLE", "DEADLINE_EXCEEDED"},
        "RemoveInstance": {"INVALID_ARGUMENT", "NOT_FOUND", "FAILED_PRECONDITION"},
        "Interrupt": {"UNIMPLEMENTED"},
    },
    "relay": {
        "Push": {OK, *_W, "ALREADY_EXISTS"},
        "Pull": {OK, "INVALID_ARGUMENT", "NOT_FOUND", "DEADLINE_EXCEEDED"},
        "Versions": {OK},
        "Heartbeat": {OK},
        "SetChain": {OK, "INVALID_ARGUMENT"},
        "OpenTransfer": {OK, *_W, "NOT_FOUND", "ALREADY_EXISTS", "DEADLINE_EXCEEDED"},
        # the raw-TCP data channel beside gRPC: a granted push whose frames are broken, or raw bytes;
        # CLOSED: the relay closed without a status (a stream cut short: it keeps the prefix for a resume)
        "DataChannel": {OK, *_W, "ALREADY_EXISTS", "PERMISSION_DENIED", "CLOSED"},
    },
}
STATUS_NAMES = {c.value[0]: c.name for c in grpc.StatusCode}
SERVICE_NAME = {"sgs": "braid.v1.Generation", "router": "braid.v1.Generation", "relay": "braid.v1.WeightRelay"}
STREAM_REQUEST = {"UpdateWeights", "Push"}
STREAM_REPLY = {"Generate", "Pull"}
VARIANTS = ("message", "bytes")


EMPTY_REQUEST = {"Health", "Versions"}  # their request has no fields: only raw bytes vary


def cases() -> list[tuple[str, str, str]]:
    """Every (service, method, variant) fuzzed."""
    return [(s, m, v) for s in ALLOWED for m in ALLOWED[s] for v in VARIANTS
            if not (m in EMPTY_REQUEST and v == "message")]


# ---------------------------------------------------------------- strategies
I64 = st.integers(-(2**63), 2**63 - 1)
U32 = st.integers(0, 2**32 - 1)
U64 = st.integers(0, 2**64 - 1)
F64 = st.floats(allow_nan=True, allow_infinity=True)
F32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
TEXT = st.one_of(st.text(max_size=12), st.text(min_size=250, max_size=300), st.just(""))
WAIT = st.one_of(st.just(0.0), st.floats(0.0, 0.3), st.sampled_from([-1.0, math.nan, math.inf, -math.inf, 1e308]))
ADDRESS = st.one_of(
    TEXT, st.builds(lambda h, p: f"{h}:{p}", st.sampled_from(["127.0.0.1", "localhost", "", "[::1]", "256.1.1.1"]),
                    st.integers(-5, 70000)),
    st.sampled_from(["SELF", "SGS", "RELAY", "ROUTER"]),  # resolved to the stack's own addresses at send time
)
DTYPES = st.one_of(st.sampled_from(["float32", "float16", "bfloat16", "float64", "int64", "int32", "uint8", "bool"]), TEXT)
SHAPE = st.lists(st.one_of(st.integers(-2, 300), I64), max_size=4)
VERSION = st.one_of(
    st.tuples(st.just("rel"), st.integers(-3, 3)),  # relative to the newest version held (resolved at send time)
    # absolute versions stop at 2**62: a version no newer one can follow (int64's last) would end the fuzzing
    st.tuples(st.just("abs"), st.integers(-(2**63), 2**62)),
)
NEWEST_CAP = 2**62 + 2**20


def prompt(vocab: int):
    token = st.one_of(st.integers(0, vocab - 1), st.integers(-(2**31), 2**31 - 1))
    return st.builds(
        pb.Prompt, prompt_id=st.one_of(st.sampled_from(["p", "q"]), TEXT), group_id=TEXT,
        token_ids=st.one_of(st.lists(token, max_size=10), st.lists(st.integers(0, vocab - 1), min_size=60, max_size=80)),
        estimated_length=F64, forced_length=st.one_of(st.integers(0, 9), U32),
    )


def generate_request(vocab: int):
    """Wild requests, or requests valid in every field but maybe one (so generation runs too)."""
    valid_prompt = st.builds(
        lambda i, ids, est, forced: pb.Prompt(prompt_id=f"v{i}", token_ids=ids, estimated_length=est, forced_length=forced),
        st.integers(0, 3), st.lists(st.integers(0, vocab - 1), min_size=1, max_size=8),
        st.floats(0.0, 100.0), st.one_of(st.just(0), st.integers(1, 8)),
    )
    valid = st.builds(
        pb.GenerateRequest, prompts=st.lists(valid_prompt, min_size=1, max_size=3, unique_by=lambda p: p.prompt_id),
        samples_per_prompt=st.integers(1, 3), max_new_tokens=st.integers(0, 8), min_weight_version=st.just(0),
        request_tag=st.text(max_size=8), interruptible=st.booleans(), temperature=st.floats(0.0, 2.0, width=32),
        top_p=st.floats(0.0, 1.0, width=32), top_k=st.integers(0, vocab),
    )
    wild = _wild_request(vocab)
    return st.one_of(wild, valid, st.tuples(valid, wild, st.sampled_from(_REQUEST_FIELDS)).map(_one_field_from))


_REQUEST_FIELDS = ("prompts", "samples_per_prompt", "max_new_tokens", "min_weight_version", "request_tag",
                   "temperature", "top_p", "top_k")


def _one_field_from(args) -> pb.GenerateRequest:
    valid, wild, name = args
    out = pb.GenerateRequest.FromString(valid.SerializeToString())
    out.ClearField(name)
    if name == "prompts":
        out.prompts.extend(wild.prompts)
    else:
        setattr(out, name, getattr(wild, name))
    return out


def _wild_request(vocab: int):
    return st.builds(
        pb.GenerateRequest, prompts=st.lists(prompt(vocab), max_size=4),
        samples_per_prompt=st.one_of(st.integers(0, 3), U32), max_new_tokens=st.one_of(st.integers(0, 9), U32),
        min_weight_version=st.one_of(st.integers(-2, 1), I64), request_tag=TEXT, interruptible=st.booleans(),
        temperature=st.one_of(st.just(0.0), F32), top_p=st.one_of(st.just(0.0), F32),
        top_k=st.one_of(st.integers(0, vocab + 2), U32),
    )


CHUNK_FIELDS = {
    "version": I64, "name": TEXT, "dtype": DTYPES, "shape": SHAPE, "offset": st.one_of(st.integers(0, 5000), U64),
    "data": st.binary(max_size=64), "tensor_bytes": st.one_of(st.integers(0, 5000), U64), "last": st.booleans(),
    "digest": st.one_of(TEXT, st.just("sha256:" + "0" * 64)), "index": st.one_of(st.integers(0, 40), U32),
    "chunk_digest": st.one_of(TEXT, st.just("xxh3_128:" + "0" * 32), st.just("md5:00")),
}
random_chunk = st.builds(pb.WeightChunk, **CHUNK_FIELDS)
INDEX = st.integers(0, 10**6)  # taken modulo the stream's length at send time

chunk_mutation = st.one_of(
    st.tuples(st.just("version_all"), VERSION),
    st.tuples(st.just("version_one"), INDEX, VERSION),
    st.tuples(st.just("drop"), INDEX),
    st.tuples(st.just("truncate"), INDEX),
    st.tuples(st.just("dup"), INDEX),
    st.tuples(st.just("swap"), INDEX, INDEX),
    st.tuples(st.just("flip"), INDEX, INDEX, st.integers(1, 255)),
    st.tuples(st.just("cut_data"), INDEX, st.integers(0, 4096)),
    st.tuples(st.just("huge_data"), INDEX),
    st.tuples(st.just("field"), INDEX, st.sampled_from(sorted(CHUNK_FIELDS)).flatmap(
        lambda f: st.tuples(st.just(f), CHUNK_FIELDS[f]))),
    st.tuples(st.just("extra"), random_chunk),
)
weight_stream = st.one_of(
    st.tuples(st.just("mutated"), st.lists(chunk_mutation, min_size=0, max_size=3)),
    st.tuples(st.just("random"), st.lists(random_chunk, max_size=4)),
)

TENSOR_FIELDS = {
    "name": TEXT, "dtype": DTYPES, "shape": SHAPE, "nbytes": st.one_of(st.integers(0, 10**6), U64, st.just(4 << 40)),
    "offset": st.one_of(st.integers(0, 10**6), U64),
}
MANIFEST_FIELDS = {
    "version": I64, "chunk_bytes": st.one_of(st.integers(0, 8192), U64),
    "version_digest": TEXT, "shm_path": st.one_of(TEXT, st.sampled_from(["/dev/shm", "/dev/shm/braid-x", "SHMDIR", "SHMBLOB"])),
    "host_id": st.one_of(TEXT, st.just("HOST")),
}
manifest_mutation = st.one_of(
    st.tuples(st.just("mfield"), st.sampled_from(sorted(MANIFEST_FIELDS)).flatmap(
        lambda f: st.tuples(st.just(f), MANIFEST_FIELDS[f]))),
    st.tuples(st.just("tfield"), INDEX, st.sampled_from(sorted(TENSOR_FIELDS)).flatmap(
        lambda f: st.tuples(st.just(f), TENSOR_FIELDS[f]))),
    st.tuples(st.just("giant"), st.sampled_from([1 << 40, 1 << 28]), st.sampled_from([1, 4096, 1 << 22])),
    st.tuples(st.just("drop_tensor"), INDEX),
    st.tuples(st.just("no_manifest")),
    st.tuples(st.just("repeat_manifest")),
    st.tuples(st.just("parts"), st.one_of(st.integers(0, 3), U32), st.one_of(st.integers(0, 3), U32)),
    st.tuples(st.just("vdigest"), TEXT),
    st.tuples(st.just("no_vdigest")),
)
push_stream = st.one_of(
    st.tuples(st.just("mutated"), st.lists(st.one_of(chunk_mutation, manifest_mutation), max_size=3)),
    st.tuples(st.just("random"), st.lists(st.builds(pb.PushMessage, chunk=random_chunk, part=U32, parts=U32,
                                                    version_digest=TEXT, sender=TEXT), max_size=3)),
)
pull_request = st.builds(
    lambda v, **kw: (v, kw), VERSION, from_chunk=st.one_of(st.integers(0, 30), U32),
    to_chunk=st.one_of(st.integers(0, 30), U32), part=st.one_of(st.integers(0, 3), U32),
    parts=st.one_of(st.integers(0, 3), U32), allow_shm=st.booleans(), host_id=st.one_of(TEXT, st.just("HOST")),
    wait_s=WAIT, head_only=st.booleans(),
)
transfer_request = st.builds(
    lambda v, m, **kw: (v, m, kw), VERSION, st.one_of(st.none(), st.lists(manifest_mutation, max_size=2)),
    direction=st.one_of(st.sampled_from(["push", "pull"]), TEXT), from_chunk=st.one_of(st.integers(0, 30), U32),
    to_chunk=st.one_of(st.integers(0, 30), U32), wait_s=WAIT, sender=TEXT,
)
chain_request = st.builds(
    lambda epoch, branches, upstream: pb.ChainRequest(
        epoch=epoch, branches=[pb.Branch(relays=b) for b in branches], upstream=upstream),
    st.one_of(st.integers(0, 5), U64), st.lists(st.lists(ADDRESS, max_size=3), max_size=3),
    st.one_of(st.just(""), ADDRESS),
)
instance_request = st.builds(lambda a, w: (a, w), ADDRESS, WAIT)
pull_weights_request = st.builds(lambda v, w: (v, w), VERSION, WAIT)
data_push = st.tuples(
    st.sampled_from(["good", "version", "direction", "magic", "token"]),  # the preamble, or what is wrong with it
    st.lists(chunk_mutation, max_size=3),
    st.one_of(st.sampled_from(["good", "none"]), st.text(max_size=60)),  # the end frame's version digest
)
raw_data = st.one_of(st.binary(max_size=300), st.binary(max_size=300).map(lambda b: b"BRD1" + b))
raw_bytes = st.one_of(st.binary(max_size=300), st.lists(st.binary(max_size=200), min_size=0, max_size=3))


# ---------------------------------------------------------------- the stack
def make_checkpoint(path: Path) -> Path:
    """The tiny policy of ``deploy/configs/smoke.yaml`` (the tests' ``tiny_checkpoint``)."""
    from services.common.config import load_config
    from services.policy.model import build_policy, save_policy

    save_policy(build_policy(load_config(ROOT / "deploy/configs/smoke.yaml").model), path)
    return path


@dataclass
class Stack:
    """A relay, an SGS instance pulling from it and the router over the instance, as processes."""

    workdir: Path
    checkpoint: Path
    sup: object = None
    addresses: dict[str, str] = field(default_factory=dict)
    channels: dict[str, grpc.Channel] = field(default_factory=dict)
    good: dict = field(default_factory=dict)  # name -> tensor: the checkpoint's weights
    vocab: int = 0
    greedy: dict[str, list] = field(default_factory=dict)  # the greedy tokens before fuzzing

    def start(self) -> Stack:
        from flows.processes import Supervisor, start_instances, start_relay, start_router
        from services.common.config import load_config, write_config
        from services.policy.model import load_policy

        self.workdir.mkdir(parents=True, exist_ok=True)
        cfg = load_config(ROOT / "deploy/configs/smoke.yaml", OVERRIDES)
        config = self.workdir / "config.json"
        write_config(cfg, config)
        self.sup = Supervisor(self.workdir)
        relay, _ = start_relay(self.sup, self.workdir, "relay", keep=2, shm=True, max_message_mb=MESSAGE_MB)
        [sgs] = start_instances(self.sup, self.workdir, str(self.checkpoint), 1, threads=1, config=config, relays=[relay])
        router = start_router(self.sup, self.workdir, str(self.checkpoint), [sgs], config=config)
        self.addresses = {"relay": relay, "sgs": sgs, "router": router}
        limit = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
        self.channels = {k: grpc.insecure_channel(a, options=limit) for k, a in self.addresses.items()}
        policy = load_policy(self.checkpoint)
        self.good = {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
        self.vocab = json.loads((self.checkpoint / "config.json").read_text())["vocab_size"]
        self.wait_healthy(120.0)
        ack = self.push_good()  # the relay's first version fixes its model fingerprint
        assert ack.committed, ack
        self.greedy = {s: self.generate_greedy(s) for s in ("sgs", "router")}
        return self

    def stop(self) -> None:
        for ch in self.channels.values():
            ch.close()
        if self.sup is not None:
            self.sup.stop_all()

    # ------------------------------------------------------------ calls
    def call(self, service: str, method: str, request, timeout_s: float = CALL_TIMEOUT_S):
        """Send ``request`` (a message, a list of messages for a request stream, or raw bytes /
        a list of them) and return (status name, details, reply or replies)."""
        path = f"/{SERVICE_NAME[service]}/{method}"
        ch = self.channels[service]
        ser = lambda m: m if isinstance(m, bytes) else m.SerializeToString()  # noqa: E731
        try:
            if method in STREAM_REQUEST:
                reply = ch.stream_unary(path, request_serializer=ser)(iter(request), timeout=timeout_s)
            elif method in STREAM_REPLY:
                reply = list(ch.unary_stream(path, request_serializer=ser)(request, timeout=timeout_s))
            else:
                reply = ch.unary_unary(path, request_serializer=ser)(request, timeout=timeout_s)
        except grpc.RpcError as err:
            return err.code().name, err.details() or "", None
        return OK, "", reply

    def data_call(self, drawn, raw: bytes | None = None) -> tuple[str, str, object]:
        """A push over the relay's data channel: granted for the next version, then the preamble
        and frames as drawn (``data_push``), or ``raw`` bytes; returns (status name, message, None)."""
        import socket

        from services.weights import datachan as dc

        version = self.next_version("relay")
        code, details, raw_grant = self.call("relay", "OpenTransfer", self.good_transfer(version))
        if code != OK:
            raise AssertionError(f"a good OpenTransfer was refused: {code} {details}")
        grant = pb.TransferGrant.FromString(raw_grant)
        sock = socket.create_connection(("127.0.0.1", grant.port), timeout=CALL_TIMEOUT_S)
        try:
            try:
                if raw is not None:
                    sock.sendall(raw)
                else:
                    preamble, mutations, end = drawn
                    token = grant.token if preamble != "token" else bytes(dc.TOKEN_BYTES)
                    sock.sendall(dc.PREAMBLE.pack(b"BRD0" if preamble == "magic" else dc.MAGIC,
                                                  dc.PULL if preamble == "direction" else dc.PUSH,
                                                  version + (preamble == "version"), token))
                    chunks = mutate_chunks(self, "relay", self.good_chunks(version), mutations)
                    for c in chunks:
                        dc.send_frame(sock, c.index, c.chunk_digest[:60], c.data)  # the frame holds <= 255 bytes
                    if end != "none":
                        dc.send_frame(sock, dc.END, self.good_chunks(version)[-1].digest if end == "good" else end)
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the relay refused and closed: its status is what counts
            try:
                code_value, message = dc.read_status(sock)
            except (OSError, ValueError):
                return "CLOSED", "", None
        finally:
            sock.close()
        return STATUS_NAMES.get(code_value, f"code {code_value}"), message, None

    def good_transfer(self, version: int) -> pb.TransferRequest:
        from services.common.weights import manifest_of
        from services.weights.convert import manifest_to_pb

        return pb.TransferRequest(direction="push", manifest=manifest_to_pb(manifest_of(self.good, CHUNK_BYTES), version),
                                  sender="fuzz")

    def health(self, service: str) -> pb.HealthReply:
        code, details, raw = self.call(service, "Health", pb.HealthRequest())
        if code != OK:
            raise AssertionError(f"{service} Health answered {code}: {details}")
        return pb.HealthReply.FromString(raw)

    def relay_versions(self) -> pb.VersionsReply:
        code, details, raw = self.call("relay", "Versions", pb.VersionsRequest())
        if code != OK:
            raise AssertionError(f"relay Versions answered {code}: {details}")
        return pb.VersionsReply.FromString(raw)

    def check_alive(self) -> None:
        """Every process runs and answers (raises ``ServiceDied`` / ``AssertionError``)."""
        self.sup.check()
        self.health("sgs")
        self.health("router")
        self.relay_versions()

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.check_alive()
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def newest(self, service: str) -> int:
        """The newest weight version ``service`` holds (installed, staged, committed or arriving)."""
        if service == "relay":
            v = self.relay_versions()
            held = [v.latest, *(i.version for i in v.versions)]
        else:
            h = self.health(service)
            held = [h.weight_version, h.pending_version]
        return max(x for x in held if x <= NEWEST_CAP)  # an arriving int64-max version (never committed) aside

    def next_version(self, service: str) -> int:
        """A version newer than any ``service`` holds (the router's fan-out reaches the SGS too)."""
        if service == "relay":
            return self.newest("relay") + 1
        return max(self.newest("sgs"), self.newest("router")) + 1

    def resolve(self, service: str, version: tuple[str, int]) -> int:
        kind, value = version
        if kind == "abs":
            return value
        return max(-(2**63), min(2**63 - 1, self.newest(service) + value))

    # ------------------------------------------------------------ good inputs
    def good_chunks(self, version: int) -> list[pb.WeightChunk]:
        from services.common.weights import iter_chunks
        from services.generation.convert import chunk_to_pb

        return [chunk_to_pb(c) for c in iter_chunks(self.good, version, CHUNK_BYTES)]

    def good_push(self, version: int) -> list[pb.PushMessage]:
        from services.common.weights import manifest_of
        from services.weights.convert import manifest_to_pb

        chunks = self.good_chunks(version)
        head = pb.PushMessage(manifest=manifest_to_pb(manifest_of(self.good, CHUNK_BYTES), version), part=0, parts=1,
                              sender="fuzz")
        return [head, *(pb.PushMessage(chunk=c) for c in chunks), pb.PushMessage(version_digest=chunks[-1].digest)]

    def push_good(self) -> pb.PushAck:
        version = self.next_version("relay")
        code, details, raw = self.call("relay", "Push", self.good_push(version))
        if code != OK:
            raise AssertionError(f"a good push of version {version} was refused: {code} {details}")
        return pb.PushAck.FromString(raw)

    def generate_greedy(self, service: str) -> list[tuple[str, list[int]]]:
        req = pb.GenerateRequest(
            prompts=[pb.Prompt(prompt_id=f"g{i}", token_ids=[1 + i, 5, 6, 7]) for i in range(3)],
            samples_per_prompt=1, max_new_tokens=8, temperature=1e-6,
        )
        code, details, raw = self.call(service, "Generate", req, timeout_s=60.0)
        if code != OK:
            raise AssertionError(f"{service}: a good Generate answered {code}: {details}")
        return sorted((s.prompt_id, list(s.token_ids)) for s in map(pb.Sample.FromString, raw))

    # ------------------------------------------------------------ nothing lost
    def check_nothing_lost(self) -> dict:
        """Every version the relay holds is the good weights byte-exact; a fresh version goes in
        and out; the SGS and the router generate the same greedy tokens as before the fuzzing."""
        import torch

        from services.weights.client import RelayClient

        self.call("relay", "SetChain", pb.ChainRequest(epoch=2**64 - 1))  # undo any fuzzed forwarding plan
        self.check_alive()
        ack = self.push_good()
        assert ack.committed, f"the relay did not commit a good version: {ack}"
        held = [v.version for v in self.relay_versions().versions if v.complete]
        assert ack.version in held, (ack.version, held)
        for data_path in ("tcp", "grpc"):
            client = RelayClient(self.addresses["relay"], data_path=data_path, max_message_mb=MESSAGE_MB)
            try:
                for v in held:
                    pulled = client.pull(v, allow_shm=data_path == "tcp")
                    bad = [k for k in self.good if not torch.equal(pulled.state[k], self.good[k])]
                    assert not bad, f"relay version {v} ({data_path}) differs from the good weights in {bad[:3]}"
            finally:
                client.close()
        for service in ("sgs", "router"):  # a good update is still taken
            version = self.next_version(service)
            code, details, _ = self.call(service, "UpdateWeights", self.good_chunks(version))
            assert code == OK, f"{service}: a good UpdateWeights of version {version} answered {code}: {details}"
        code, details, _ = self.call("sgs", "PullWeights", pb.PullWeightsRequest(version=-1))
        assert code == OK, f"sgs: PullWeights(-1) answered {code}: {details}"
        for service in ("sgs", "router"):
            got = self.generate_greedy(service)
            assert got == self.greedy[service], f"{service}: greedy tokens changed: {got} != {self.greedy[service]}"
        return {"relay_versions_checked": len(held), "greedy_unchanged": True}


# ---------------------------------------------------------------- applying the drawn inputs
def _at(items: list, i: int) -> int:
    return i % len(items) if items else 0


def mutate_chunks(stack: Stack, service: str, chunks: list[pb.WeightChunk], mutations) -> list:
    """Apply ``mutations`` to a copy of the good chunk stream (messages; ``bytes`` for raw)."""
    out = [pb.WeightChunk.FromString(c.SerializeToString()) for c in chunks]
    for m in mutations:
        kind = m[0]
        if not out and kind != "extra":
            continue
        if kind == "version_all":
            v = stack.resolve(service, m[1])
            for c in out:
                c.version = v
        elif kind == "version_one":
            out[_at(out, m[1])].version = stack.resolve(service, m[2])
        elif kind == "drop":
            del out[_at(out, m[1])]
        elif kind == "truncate":
            out = out[: _at(out, m[1])]
        elif kind == "dup":
            i = _at(out, m[1])
            out.insert(i, out[i])
        elif kind == "swap":
            i, j = _at(out, m[1]), _at(out, m[2])
            out[i], out[j] = out[j], out[i]
        elif kind == "flip":
            c = out[_at(out, m[1])]
            if c.data:
                data = bytearray(c.data)
                data[m[2] % len(data)] ^= m[3]
                c.data = bytes(data)
        elif kind == "cut_data":
            c = out[_at(out, m[1])]
            c.data = c.data[: m[2]]
        elif kind == "huge_data":  # over the receiver's message limit: RESOURCE_EXHAUSTED from the transport
            out[_at(out, m[1])].data = bytes(MESSAGE_MB * 1024 * 1024 + 1)
        elif kind == "field":
            c, (name, value) = out[_at(out, m[1])], m[2]
            if name == "shape":
                c.ClearField("shape")
                c.shape.extend(value)
            else:
                setattr(c, name, value)
        elif kind == "extra":
            out.append(m[1])
    return out


def push_messages(stack: Stack, drawn) -> list:
    """A push stream: the good one with chunk and manifest mutations, or random messages."""
    kind, items = drawn
    if kind == "random":
        return items
    msgs = stack.good_push(stack.next_version("relay"))
    head, chunks, tail = msgs[0], [m.chunk for m in msgs[1:-1]], msgs[-1]
    chunk_muts = [m for m in items if m[0] in CHUNK_MUTATIONS]
    chunks = mutate_chunks(stack, "relay", chunks, chunk_muts)
    head.manifest.CopyFrom(mutate_manifest(stack, head.manifest, [m for m in items if m[0] not in CHUNK_MUTATIONS]))
    body = [pb.PushMessage(chunk=c) for c in chunks]
    for m in items:
        if m[0] == "parts":
            head.part, head.parts = m[1], m[2]
        elif m[0] == "vdigest":
            tail.version_digest = m[1]
    out = [head, *body, tail]
    if any(m[0] == "no_vdigest" for m in items):
        out = out[:-1]
    if any(m[0] == "repeat_manifest" for m in items):
        out.insert(len(out) // 2, head)
    if any(m[0] == "no_manifest" for m in items):
        out = out[1:]
    return out


CHUNK_MUTATIONS = {"version_all", "version_one", "drop", "truncate", "dup", "swap", "flip", "cut_data", "huge_data",
                   "field", "extra"}


def mutate_manifest(stack: Stack, manifest: pb.WeightManifest, mutations) -> pb.WeightManifest:
    out = pb.WeightManifest.FromString(manifest.SerializeToString())
    for m in mutations:
        kind = m[0]
        if kind == "mfield":
            name, value = m[1]
            if name == "shm_path":
                value = {"SHMDIR": f"/dev/shm/braid-relay-{stack.sup.services[0].proc.pid}",
                         "SHMBLOB": _a_blob(stack)}.get(value, value)
            if name == "host_id" and value == "HOST":
                from services.weights.store import host_id

                value = host_id()
            setattr(out, name, value)
        elif kind == "tfield" and out.tensors:
            t, (name, value) = out.tensors[_at(out.tensors, m[1])], m[2]
            if name == "shape":
                t.ClearField("shape")
                t.shape.extend(value)
            else:
                setattr(t, name, value)
        elif kind == "giant":  # a version far beyond the relay's memory, or with too many chunks
            del out.tensors[:]
            out.tensors.add(name="giant", dtype="float32", shape=[m[1] // 4], nbytes=m[1], offset=0)
            out.chunk_bytes = m[2]
        elif kind == "drop_tensor" and out.tensors:
            del out.tensors[_at(out.tensors, m[1])]
    return out


def _a_blob(stack: Stack) -> str:
    """The shared-memory file of a version the relay holds (pushing by reference to it)."""
    code, _, raw = stack.call("relay", "Pull", pb.PullRequest(version=-1, allow_shm=True, head_only=True,
                                                              host_id=_host()))
    return pb.PullMessage.FromString(raw[0]).manifest.shm_path if code == OK and raw else "/dev/shm/braid-none"


def _host() -> str:
    from services.weights.store import host_id

    return host_id()


def _address(stack: Stack, a: str) -> str:
    return {"SELF": stack.addresses.get("router", a), "SGS": stack.addresses["sgs"], "RELAY": stack.addresses["relay"],
            "ROUTER": stack.addresses["router"]}.get(a, a)


def build(stack: Stack, service: str, method: str, drawn):
    """The request (message(s)) for a drawn value of ``strategy(service, method)``, and the call's timeout."""
    if method == "Generate":
        return drawn, CALL_TIMEOUT_S
    if method == "UpdateWeights":
        kind, items = drawn
        if kind == "random":
            return items, CALL_TIMEOUT_S
        return mutate_chunks(stack, service, stack.good_chunks(stack.next_version(service)), items), CALL_TIMEOUT_S
    if method in ("Health", "Versions"):
        return (pb.HealthRequest() if method == "Health" else pb.VersionsRequest()), CALL_TIMEOUT_S
    if method == "Heartbeat":
        return pb.HeartbeatRequest(caller=drawn), CALL_TIMEOUT_S
    if method == "PullWeights":
        return pb.PullWeightsRequest(version=stack.resolve("relay", drawn[0]), wait_s=drawn[1]), CALL_TIMEOUT_S
    if method in ("AddInstance", "RemoveInstance"):
        return pb.InstanceRequest(address=_address(stack, drawn[0]), wait_s=drawn[1]), 1.0  # waits end with the call
    if method == "Interrupt":
        return pb.InterruptRequest(request_tags=drawn), CALL_TIMEOUT_S
    if method == "Push":
        return push_messages(stack, drawn), CALL_TIMEOUT_S
    if method == "Pull":
        version, kw = drawn
        if kw["host_id"] == "HOST":
            kw = {**kw, "host_id": _host()}
        return pb.PullRequest(version=stack.resolve("relay", version), **kw), 2.0
    if method == "SetChain":
        for b in drawn.branches:
            b.relays[:] = [_address(stack, a) for a in b.relays]
        drawn.upstream = _address(stack, drawn.upstream) if drawn.upstream else ""
        return drawn, CALL_TIMEOUT_S
    if method == "OpenTransfer":
        version, muts, kw = drawn
        req = pb.TransferRequest(version=stack.resolve("relay", version), **kw)
        if muts is not None:
            from services.common.weights import manifest_of
            from services.weights.convert import manifest_to_pb

            good = manifest_to_pb(manifest_of(stack.good, CHUNK_BYTES), stack.next_version("relay"))
            req.manifest.CopyFrom(mutate_manifest(stack, good, muts))
        return req, 2.0
    raise KeyError(method)


def strategy(stack: Stack, service: str, method: str, variant: str):
    if variant == "bytes":
        return raw_data if method == "DataChannel" else raw_bytes
    return {
        "DataChannel": data_push,
        "Generate": generate_request(stack.vocab), "UpdateWeights": weight_stream, "Health": st.just(None),
        "PullWeights": pull_weights_request, "AddInstance": instance_request, "RemoveInstance": instance_request,
        "Interrupt": st.lists(TEXT, max_size=5),
        "Push": push_stream, "Pull": pull_request, "Versions": st.just(None), "Heartbeat": TEXT,
        "SetChain": chain_request, "OpenTransfer": transfer_request,
    }[method]


# ---------------------------------------------------------------- the property
@dataclass
class Tally:
    """Inputs tried and status codes returned, per service and method (and variant)."""

    counts: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(Counter)))
    crashes: list = field(default_factory=list)
    seconds: dict = field(default_factory=lambda: defaultdict(float))

    def add(self, service: str, method: str, variant: str, code: str) -> None:
        self.counts[service][method][f"{variant}:{code}"] += 1

    def summary(self) -> dict:
        out: dict = {}
        for service, methods in sorted(self.counts.items()):
            per = {}
            for method, c in sorted(methods.items()):
                codes = Counter()
                for key, n in c.items():
                    codes[key.split(":", 1)[1]] += n
                per[method] = {
                    "inputs": sum(c.values()),
                    "by_variant": {v: sum(n for k, n in c.items() if k.startswith(v + ":")) for v in VARIANTS},
                    "codes": dict(sorted(codes.items())),
                    "crashes": sum(1 for x in self.crashes if x["service"] == service and x["method"] == method),
                }
            out[service] = {"inputs": sum(m["inputs"] for m in per.values()),
                            "crashes": sum(m["crashes"] for m in per.values()), "methods": per}
        return out


def check_reply(stack: Stack, service: str, method: str, request, code: str, details: str, timeout_s: float) -> None:
    """The per-example property (see the module docstring); raises ``AssertionError``."""
    allowed = ALLOWED[service][method] | ({"INVALID_ARGUMENT"} if request is None else set())  # raw bytes may not parse
    assert code not in CRASH_CODES, f"{service}.{method} answered {code}: {details}"
    assert code in allowed, f"{service}.{method} answered {code} (allowed {sorted(allowed)}): {details}"
    if code not in (OK, "CLOSED"):
        assert details.strip(), f"{service}.{method} answered {code} with no message"
    if code == "DEADLINE_EXCEEDED" and method == "Generate" and isinstance(request, pb.GenerateRequest):
        newest = stack.newest(service)
        assert request.min_weight_version > newest, (
            f"{service}.Generate timed out although min_weight_version {request.min_weight_version} <= {newest} "
            f"is installed")
    if code == "DEADLINE_EXCEEDED" and method in ("Pull", "OpenTransfer") and request is not None:
        assert request.wait_s >= timeout_s / 2, f"relay.{method} timed out although asked to wait {request.wait_s} s"
    stack.check_alive()


def run_case(stack: Stack, service: str, method: str, variant: str, examples: int, tally: Tally, *,
             seed_: int | None = None, shrink: bool = True) -> None:
    """Fuzz one (service, method, variant) with ``examples`` inputs; raises on the first crash
    (after hypothesis shrinks it unless ``shrink`` is False)."""
    phases = (Phase.explicit, Phase.generate, Phase.shrink) if shrink else (Phase.explicit, Phase.generate)

    @settings(max_examples=examples, deadline=None, database=None, derandomize=seed_ is None, phases=phases,
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(strategy(stack, service, method, variant))
    def prop(drawn) -> None:
        t0 = time.monotonic()
        if method == "DataChannel":
            request, timeout_s = drawn, CALL_TIMEOUT_S
            code, details, _ = stack.data_call(drawn, raw=drawn if variant == "bytes" else None)
        else:
            if variant == "bytes":  # one message, or a request stream of them
                parts = [drawn] if isinstance(drawn, bytes) else drawn
                request, timeout_s = (parts if method in STREAM_REQUEST else b"".join(parts)), 3.0
            else:
                request, timeout_s = build(stack, service, method, drawn)
            code, details, _ = stack.call(service, method, request, timeout_s=timeout_s)
        tally.add(service, method, variant, code)
        tally.seconds[f"{service}.{method}"] += time.monotonic() - t0
        check_reply(stack, service, method, request if variant == "message" else None, code, details, timeout_s)

    if seed_ is not None:
        prop = seed(seed_ + zlib.crc32(f"{service}.{method}.{variant}".encode()))(prop)
    prop()


def run_all(stack: Stack, examples: int, tally: Tally, *, seed_: int, cases_: list | None = None,
            progress=None) -> None:
    """Every case, recording crashes in ``tally`` instead of stopping (the bench)."""
    for service, method, variant in cases_ or cases():
        try:
            run_case(stack, service, method, variant, examples, tally, seed_=seed_, shrink=False)
        except Exception as err:  # a crash is a result here: record it and go on
            tally.crashes.append({"service": service, "method": method, "variant": variant,
                                  "error": f"{type(err).__name__}: {err}"[:2000]})
            try:
                stack.wait_healthy(30.0)
            except Exception as dead:
                tally.crashes.append({"service": service, "method": method, "variant": variant,
                                      "error": f"not healthy afterwards: {dead}"[:2000]})
                raise
        if progress is not None:
            progress(service, method, variant)

