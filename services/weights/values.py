"""What the weight relay's client takes, hands back and raises: the version snapshot, progress,
pulled versions and ``RelayError``. No network here, so the data-path helpers use these without
importing the client (``services.weights.client`` re-exports them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

from services.common.weights import Manifest, WeightStream, flatten_into, manifest_of
from services.proto import braid_pb2 as pb
from services.weights.blob import Blob


@dataclass(frozen=True)
class VersionState:
    version: int
    complete: bool
    received: int
    chunks: int
    bytes: int
    digest: str
    committed_at: float
    delta: bool = False  # arriving as a delta, or (complete) holding the delta it arrived as
    delta_base: int = -1


@dataclass(frozen=True)
class RelayInfo:
    relay_id: str
    host_id: str
    latest: int
    versions: dict[int, VersionState]

    @property
    def held(self) -> list[int]:
        return sorted(v for v, s in self.versions.items() if s.complete)


@dataclass
class Pulled:
    version: int
    manifest: Manifest
    blob: object  # keeps the bytes alive while ``state`` views them
    state: dict
    digest: str
    path: str  # "shm", "tcp" (data channel) or "stream" (gRPC)
    refetched: int = 0
    prefaulted: bool = False  # received into the buffer ``reserve`` had prepared
    delta_base: int | None = None  # it came as the delta from this version (``RelayClient.pull(have=...)``)
    delta_bytes: int = 0  # the delta's bytes (what crossed instead of the whole version)
    fallback: str = ""  # a delta was asked for and the version came whole: why


@dataclass(frozen=True)
class WeightBlob:
    """A version's bytes, flat, ready to push (``snapshot_blob``)."""

    manifest: Manifest
    blob: Blob


def snapshot_blob(state, chunk_bytes: int, shm_dir: Path | None, spare: Blob | None = None,
                  dtype: str | None = None) -> WeightBlob:
    """Copy ``state`` (a state dict or a ``WeightStream``, drawn tensor by tensor straight into the
    blob) into one flat blob (shared memory when ``shm_dir``): the trainer's only stall.
    ``spare``: a pre-populated blob of the right size and kind to copy into (no page faults);
    ``dtype``: cast floating-point tensors to it on the way (``weights.dtype``)."""
    state = WeightStream.of(state)
    if dtype is not None:
        state = state.cast(dtype)
    manifest = manifest_of(state.specs, chunk_bytes)
    fits = (spare is not None and spare.size == manifest.total_bytes
            and (spare.path is not None) == (shm_dir is not None))
    blob = spare if fits else Blob(manifest.total_bytes, shm_dir)
    flatten_into(state, manifest, blob.view)
    return WeightBlob(manifest, blob)


class RelayError(RuntimeError):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code


def _info(reply: pb.VersionsReply) -> RelayInfo:
    versions = {
        v.version: VersionState(v.version, v.complete, v.received, v.chunks, v.bytes, v.digest, v.committed_at,
                                v.delta, v.delta_base)
        for v in reply.versions
    }
    return RelayInfo(reply.relay_id, reply.host_id, reply.latest, versions)
