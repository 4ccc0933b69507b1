"""What the gRPC fuzzing sends (issue 20 item 5): hypothesis strategies and how a drawn value
becomes the request.

Every method of ``braid.proto`` gets protobuf messages built to be wrong (huge, negative, NaN and
infinite numbers, empty and oversized strings, token ids outside the vocabulary, old/current/future
weight versions) or requests valid in every field but one; weight streams and pushes are made from
the stack's good version by mutations (truncated, reordered, duplicated, corrupted chunks, wrong
names, dtypes, shapes, offsets, digests, indices, manifests); and raw random bytes (the ``bytes``
variant). Versions and addresses are drawn symbolically (relative to the newest version held,
``SELF``/``SGS``/``RELAY``/``ROUTER``) and resolved against the running ``Stack`` at send time, so
an example means the same thing whatever ran before it; so are environment sessions (a fresh one of
a kind, or one an expert's turn in) and reward transcripts (an expert's episode with one edit).
``data_call`` writes a drawn push to the relay's raw-TCP data channel.
"""

from __future__ import annotations

import math

import grpc
from hypothesis import strategies as st

from bench.fuzz_stack import CALL_TIMEOUT_S, CHUNK_BYTES, MESSAGE_MB, OK, Stack
from services.proto import braid_pb2 as pb

STATUS_NAMES = {c.value[0]: c.name for c in grpc.StatusCode}


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
DTYPES = st.one_of(st.sampled_from(["float32", "float16", "bfloat16", "float64", "int64", "int32", "uint8", "bool"]),
                   TEXT)
SHAPE = st.lists(st.one_of(st.integers(-2, 300), I64), max_size=4)
VERSION = st.one_of(
    st.tuples(st.just("rel"), st.integers(-3, 3)),  # relative to the newest version held (resolved at send time)
    # absolute versions stop at 2**62: a version no newer one can follow (int64's last) would end the fuzzing
    st.tuples(st.just("abs"), st.integers(-(2**63), 2**62)),
)


def prompt(vocab: int):
    token = st.one_of(st.integers(0, vocab - 1), st.integers(-(2**31), 2**31 - 1))
    return st.builds(
        pb.Prompt, prompt_id=st.one_of(st.sampled_from(["p", "q"]), TEXT), group_id=TEXT,
        token_ids=st.one_of(st.lists(token, max_size=10),
                            st.lists(st.integers(0, vocab - 1), min_size=60, max_size=80)),
        estimated_length=F64, forced_length=st.one_of(st.integers(0, 9), U32),
    )


def generate_request(vocab: int):
    """Wild requests, or requests valid in every field but maybe one (so generation runs too)."""
    valid_prompt = st.builds(
        lambda i, ids, est, forced: pb.Prompt(prompt_id=f"v{i}", token_ids=ids, estimated_length=est,
                                              forced_length=forced),
        st.integers(0, 3), st.lists(st.integers(0, vocab - 1), min_size=1, max_size=8),
        st.floats(0.0, 100.0), st.one_of(st.just(0), st.integers(1, 8)),
    )
    valid = st.builds(
        pb.GenerateRequest, prompts=st.lists(valid_prompt, min_size=1, max_size=3, unique_by=lambda p: p.prompt_id),
        samples_per_prompt=st.integers(1, 3), max_new_tokens=st.integers(0, 8), min_weight_version=st.just(0),
        request_tag=st.text(max_size=8), interruptible=st.booleans(), temperature=st.floats(0.0, 2.0, width=32),
        top_p=st.floats(0.0, 1.0, width=32), top_k=st.integers(0, vocab), seed=st.one_of(st.none(), U64),
    )
    wild = _wild_request(vocab)
    return st.one_of(wild, valid, st.tuples(valid, wild, st.sampled_from(_REQUEST_FIELDS)).map(_one_field_from))


_REQUEST_FIELDS = ("prompts", "samples_per_prompt", "max_new_tokens", "min_weight_version", "request_tag",
                   "temperature", "top_p", "top_k", "seed")


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
        top_k=st.one_of(st.integers(0, vocab + 2), U32), seed=st.one_of(st.none(), U64),
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
    "version_digest": TEXT,
    "shm_path": st.one_of(TEXT, st.sampled_from(["/dev/shm", "/dev/shm/braid-x", "SHMDIR", "SHMBLOB"])),
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
                from services.weights.blob import host_id

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


# ---------------------------------------------------------------- environment and reward workers (issue 21)
ACTION = st.one_of(TEXT, st.text(min_size=4090, max_size=4200),  # around the 4096-character limit
                   st.sampled_from(["247-9", "#193", "=", "#", "-", "1+", "99999999999999999999-1", "#-0", "left",
                                    "#1e309", "9" * 400 + "-1", ">", "->", ">>>>", ">" * 70, "-" * 64, "> -"]))
KIND = st.one_of(st.sampled_from(["calculator", "walk", "arith"]), TEXT)
reset_request = st.builds(pb.ResetRequest, kind=KIND, seed=I64,
                          trajectory_id=st.one_of(TEXT, st.text(min_size=257, max_size=260)))


def _mostly(good, wild):
    """``good`` three times in four, ``wild`` otherwise (``one_of`` weighs each branch of a nested
    ``one_of`` alike, so the wild text's three branches would crowd out the good requests)."""
    return st.integers(0, 3).flatmap(lambda i: wild if i == 0 else good)


# a session opened at send time (kind, expert turns applied) or any text
SESSION = _mostly(st.tuples(st.sampled_from(["calculator", "walk"]), st.integers(0, 1)), TEXT)
# "AT": the session's own turn (the step applies); otherwise any turn
step_request = st.tuples(SESSION, st.one_of(st.just("AT"), st.integers(0, 3), U32), ACTION)
_TRANSCRIPT_EDITS = ("none", "prompt", "action", "observation", "seed", "task", "truncate", "extend")
score_request = _mostly(st.one_of(
    st.builds(  # a single-turn completion of the arith task
        lambda prompt, action, obs: pb.ScoreRequest(task="arith", prompt=prompt, actions=[action], observations=obs),
        st.one_of(st.sampled_from(["247-9>200=", "12-3>5=", "999999999-1>0=", "9>5="]), TEXT), ACTION,
        st.sampled_from([[], [""], ["x"]]),
    ),
    # an expert's transcript (resolved at send time) with one edit: ("EXPERT", kind, edit, index, text, seed)
    st.tuples(st.just("EXPERT"), st.sampled_from(["calculator", "walk"]), st.sampled_from(_TRANSCRIPT_EDITS),
              st.integers(0, 8), ACTION, I64),
), st.builds(  # anything
    pb.ScoreRequest, request_id=st.one_of(TEXT, st.text(min_size=257, max_size=260)), task=KIND, seed=I64,
    prompt=st.one_of(TEXT, st.sampled_from(["247-9>200=", "9>5="])),
    actions=st.one_of(st.lists(ACTION, max_size=4), st.lists(st.just("1-1"), min_size=1000, max_size=1100)),
    observations=st.lists(TEXT, max_size=5),
))


def _session(stack: Stack, session) -> tuple[str, int]:
    """(session id, its turn) for a drawn ``SESSION``."""
    if isinstance(session, tuple):
        kind, steps = session
        return stack.open_session(kind, steps), steps
    return session, 0


def _score_request(stack: Stack, drawn) -> pb.ScoreRequest:
    if isinstance(drawn, pb.ScoreRequest):
        return drawn
    _, kind, edit, index, text, seed = drawn
    req = stack.transcript(stack.episodes[kind])
    n = len(req.actions)
    if edit == "prompt":
        req.prompt = text
    elif edit == "action":
        req.actions[index % n] = text
    elif edit == "observation":
        req.observations[index % n] = text
    elif edit == "seed":
        req.seed = seed
    elif edit == "task":
        req.task = "walk" if kind == "calculator" else "calculator"
    elif edit == "truncate":  # a prefix: the episode has not ended (reward 0)
        del req.actions[index % n:], req.observations[index % n:]
    elif edit == "extend":  # a turn after the episode ended
        req.actions.append(text), req.observations.append("")
    return req


def _host() -> str:
    from services.weights.blob import host_id

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
    if method == "Step":
        session, turn, action = drawn
        session_id, at = _session(stack, session)
        return pb.StepRequest(session_id=session_id, turn=at if turn == "AT" else turn, action=action), CALL_TIMEOUT_S
    if method == "Close":
        return pb.CloseRequest(session_id=_session(stack, drawn)[0]), CALL_TIMEOUT_S
    if method == "Reset":
        return drawn, CALL_TIMEOUT_S
    if method == "Score":
        return _score_request(stack, drawn), CALL_TIMEOUT_S
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
        "Reset": reset_request, "Step": step_request, "Close": SESSION, "Score": score_request,
    }[method]


def data_call(stack: Stack, drawn, raw: bytes | None = None) -> tuple[str, str, object]:
    """A push over the relay's data channel: granted for the next version, then the preamble
    and frames as drawn (``data_push``), or ``raw`` bytes; returns (status name, message, None)."""
    import socket

    from services.weights import datachan as dc

    version = stack.next_version("relay")
    code, details, raw_grant = stack.call("relay", "OpenTransfer", stack.good_transfer(version))
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
                chunks = mutate_chunks(stack, "relay", stack.good_chunks(version), mutations)
                for c in chunks:
                    dc.send_frame(sock, c.index, c.chunk_digest[:60], c.data)  # the frame holds <= 255 bytes
                if end != "none":
                    dc.send_frame(sock, dc.END, stack.good_chunks(version)[-1].digest if end == "good" else end)
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
