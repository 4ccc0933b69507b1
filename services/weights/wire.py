"""Chunk messages on the wire without protobuf copies of the data (standard protobuf encoding).

A ``PushMessage`` / ``PullMessage`` carrying a chunk is ``field 2 (chunk) { metadata fields,
field 6 (data) }``. Protobuf lets fields come in any order, so the sender serializes the small
metadata with protobuf and appends the data field itself: one copy from the version's blob into
the message bytes instead of four (bytes slice, message field, serialization, ...). The
receiver scans the message for the data field and keeps a ``memoryview`` of it (no copy),
parsing only the rest with protobuf. Any protobuf peer reads and writes these messages: they
are ordinary ``braid.proto`` messages; only the Python relay and client take this path
(``service_handler`` / ``push_callable`` / ``pull_callable`` below, registered instead of the
generated stubs, with the same method names).
"""

from __future__ import annotations

import grpc

from services.common.weights import Chunk
from services.proto import braid_pb2 as pb

# WeightError kinds -> the gRPC status every weight service answers with
WEIGHT_ERROR_CODES = {
    "argument": grpc.StatusCode.INVALID_ARGUMENT,
    "precondition": grpc.StatusCode.FAILED_PRECONDITION,
    "integrity": grpc.StatusCode.DATA_LOSS,
    "not_found": grpc.StatusCode.NOT_FOUND,
    "exists": grpc.StatusCode.ALREADY_EXISTS,
    "resource": grpc.StatusCode.RESOURCE_EXHAUSTED,
}

SERVICE = "braid.v1.WeightRelay"
CHUNK_FIELD = 2  # PushMessage.chunk and PullMessage.chunk
DATA_FIELD = 6  # WeightChunk.data


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _read_varint(buf, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("malformed varint")


def _fields(buf, start: int, end: int):
    """(field number, start of the whole field, start of the payload, end) for each field."""
    pos = start
    while pos < end:
        field_start = pos
        key, pos = _read_varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _read_varint(buf, pos)
            yield field, field_start, pos, pos
        elif wire == 1:
            pos += 8
            yield field, field_start, pos - 8, pos
        elif wire == 2:
            n, pos = _read_varint(buf, pos)
            yield field, field_start, pos, pos + n
            pos += n
        elif wire == 5:
            pos += 4
            yield field, field_start, pos - 4, pos
        else:
            raise ValueError(f"unsupported wire type {wire}")
    if pos != end:
        raise ValueError("truncated message")


def encode_chunk(chunk: Chunk, data) -> bytes:
    """A Push/Pull message carrying ``chunk`` (its ``data`` ignored) with ``data`` (any buffer;
    copied once, into the message)."""
    meta = pb.WeightChunk(
        version=chunk.version, name=chunk.name, dtype=chunk.dtype, shape=list(chunk.shape), offset=chunk.offset,
        tensor_bytes=chunk.tensor_bytes, last=chunk.last, digest=chunk.digest, index=chunk.index,
        chunk_digest=chunk.chunk_digest,
    ).SerializeToString()
    n = len(data)
    data_head = bytes([DATA_FIELD << 3 | 2]) + _varint(n)
    inner = len(meta) + len(data_head) + n
    return b"".join((bytes([CHUNK_FIELD << 3 | 2]), _varint(inner), meta, data_head, data))


def decode(message_cls, buf: bytes):
    """Parse a Push/Pull message; returns (message without chunk data, data as memoryview or None)."""
    mv = memoryview(buf)
    for field, fstart, start, end in _fields(mv, 0, len(mv)):
        if field != CHUNK_FIELD:
            continue
        for inner, istart, dstart, dend in _fields(mv, start, end):
            if inner == DATA_FIELD:  # parse everything but the data (re-framing the chunk field)
                meta = b"".join((mv[start:istart], mv[dend:end]))
                rest = b"".join((mv[:fstart], bytes([CHUNK_FIELD << 3 | 2]), _varint(len(meta)), meta, mv[end:]))
                return message_cls.FromString(rest), mv[dstart:dend]
    return message_cls.FromString(buf), None


def chunk_of(msg_chunk: pb.WeightChunk, data) -> Chunk:
    return Chunk(
        version=msg_chunk.version, name=msg_chunk.name, dtype=msg_chunk.dtype, shape=tuple(msg_chunk.shape),
        offset=msg_chunk.offset, data=data if data is not None else b"", tensor_bytes=msg_chunk.tensor_bytes,
        last=msg_chunk.last, digest=msg_chunk.digest, index=msg_chunk.index, chunk_digest=msg_chunk.chunk_digest,
    )


def _serialize(msg) -> bytes:
    return msg if isinstance(msg, bytes) else msg.SerializeToString()


def service_handler(servicer) -> grpc.GenericRpcHandler:
    """The WeightRelay service with zero-copy chunk (de)serialization for Push and Pull."""
    handlers = {
        "Push": grpc.stream_unary_rpc_method_handler(
            servicer.Push, request_deserializer=lambda b: decode(pb.PushMessage, b),
            response_serializer=pb.PushAck.SerializeToString,
        ),
        "Pull": grpc.unary_stream_rpc_method_handler(
            servicer.Pull, request_deserializer=pb.PullRequest.FromString, response_serializer=_serialize,
        ),
        "Versions": grpc.unary_unary_rpc_method_handler(
            servicer.Versions, request_deserializer=pb.VersionsRequest.FromString,
            response_serializer=pb.VersionsReply.SerializeToString,
        ),
        "Heartbeat": grpc.unary_unary_rpc_method_handler(
            servicer.Heartbeat, request_deserializer=pb.HeartbeatRequest.FromString,
            response_serializer=pb.VersionsReply.SerializeToString,
        ),
        "OpenTransfer": grpc.unary_unary_rpc_method_handler(
            servicer.OpenTransfer, request_deserializer=pb.TransferRequest.FromString,
            response_serializer=pb.TransferGrant.SerializeToString,
        ),
        "SetChain": grpc.unary_unary_rpc_method_handler(
            servicer.SetChain, request_deserializer=pb.ChainRequest.FromString,
            response_serializer=pb.ChainReply.SerializeToString,
        ),
    }
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


def push_callable(channel: grpc.Channel):
    return channel.stream_unary(
        f"/{SERVICE}/Push", request_serializer=_serialize, response_deserializer=pb.PushAck.FromString
    )


def pull_callable(channel: grpc.Channel):
    return channel.unary_stream(
        f"/{SERVICE}/Pull", request_serializer=pb.PullRequest.SerializeToString,
        response_deserializer=lambda b: decode(pb.PullMessage, b),
    )
