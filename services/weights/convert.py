"""Protobuf <-> dataclass conversion for the weight relay (the only place its pb2 types meet them)."""

from __future__ import annotations

from services.common.weights import Manifest, TensorEntry
from services.proto import braid_pb2 as pb


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
