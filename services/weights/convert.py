"""Protobuf <-> dataclass conversion for the weight relay (the only place its pb2 types meet them)."""

from __future__ import annotations

from services.common.weights import Manifest, TensorEntry
from services.proto import braid_pb2 as pb
from services.weights.store import Incoming, Stored


def manifest_to_pb(m: Manifest, version: int, **extra) -> pb.WeightManifest:
    return pb.WeightManifest(
        version=version,
        tensors=[
            pb.TensorEntry(name=t.name, dtype=t.dtype, shape=list(t.shape), nbytes=t.nbytes, offset=t.offset)
            for t in m.tensors
        ],
        chunk_bytes=m.chunk_bytes,
        **extra,
    )


def manifest_from_pb(m: pb.WeightManifest) -> Manifest:
    return Manifest(
        tuple(TensorEntry(t.name, t.dtype, tuple(t.shape), t.nbytes, t.offset) for t in m.tensors), m.chunk_bytes
    )


def delta_base(m: pb.WeightManifest) -> int | None:
    """The base a manifest names when it describes a delta, else None."""
    return m.delta_base if m.delta else None


def delta_fields(item: Incoming | Stored, full: Stored | None = None) -> dict:
    """``manifest_to_pb`` fields saying ``item`` is a delta: an arriving delta (``Incoming`` with a
    base), or the delta a committed version ``full`` holds (``item`` is then ``full.delta``); nothing
    for a whole version."""
    if full is not None:
        return {"delta": True, "delta_base": full.delta_base} if item is not full else {}
    base = item.delta_base if isinstance(item, Incoming) else None
    return {"delta": True, "delta_base": base} if base is not None else {}
