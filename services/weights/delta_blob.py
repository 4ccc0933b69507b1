"""A delta version as the weight plane carries it, and what a receiver does with one.

The frames of ``services.weights.delta`` (a version frame, then one tensor frame per tensor of the
model) travel as the tensors of a manifest of their own: ``uint8`` tensors named ``delta.header``,
``delta.0`` ... ``delta.<n-1>``, laid out and chunked like any version. So every path that moves a
version (push and pull over gRPC or the raw-TCP data channel, shared memory, relay forwarding,
chunk digests, resume from the first missing chunk) moves a delta unchanged; the manifest message
says ``delta`` and names the base (``WeightManifest.delta_base``).

A receiver holding the base (``Held``: its version, layout, bytes and the publisher's digest)
``materialize``s the new version: the base's bytes copied into a fresh buffer, the delta applied,
the result's version digest checked against the publisher's (``delta.apply_version``). The held
base is never written.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.weights import Manifest, WeightError, manifest_of
from services.weights import delta_version as DV
from services.weights.blob import Blob
from services.weights.values import WeightBlob

PREFIX = "delta."
HEADER = "delta.header"
MAX_SHARE = 0.9  # a delta is sent only when smaller than this share of the full version (else whole)


@dataclass(frozen=True)
class Held:
    """A full version a receiver holds: the base the next delta applies to. ``data`` keeps the
    buffer ``view`` reads alive."""

    version: int
    manifest: Manifest
    view: memoryview
    digest: str
    data: object = None


@dataclass(frozen=True)
class Encoded:
    """The publisher's view of a new version: its chunk digests and version digest (as a full push
    computes them) and, when it pays, the delta from the previous version."""

    chunk_digests: list[str]
    digest: str
    delta: WeightBlob | None
    delta_bytes: int  # 0 when no delta was made


def _names(n: int) -> list[str]:
    return [HEADER, *(f"{PREFIX}{i}" for i in range(n))]


def delta_manifest(sizes: list[int], chunk_bytes: int) -> Manifest:
    """The layout of a delta whose frames have ``sizes`` (the version frame first)."""
    from services.common.weights import TensorSpec

    return manifest_of({n: TensorSpec("uint8", (k,)) for n, k in zip(_names(len(sizes) - 1), sizes, strict=True)},
                       chunk_bytes)


def is_delta_layout(manifest: Manifest) -> bool:
    return bool(manifest.tensors) and manifest.tensors[0].name == HEADER


def check_layout(manifest: Manifest) -> None:
    """Refuse a manifest that is not a delta's layout (names in order, uint8, one dimension)."""
    if not manifest.tensors:
        raise WeightError("argument", "a delta has at least its version frame")
    for t, name in zip(manifest.tensors, _names(len(manifest.tensors) - 1), strict=True):
        if t.name != name or t.dtype != "uint8" or len(t.shape) != 1:
            raise WeightError("argument", f"a delta's tensors are uint8 frames named {HEADER}, {PREFIX}0, ...; "
                                          f"got {t.name!r} ({t.dtype}, shape {list(t.shape)})")


def frames_of(manifest: Manifest, view) -> list[memoryview]:
    """The frames of a delta held in ``view`` (laid out by ``manifest``)."""
    check_layout(manifest)
    mv = memoryview(view)
    return [mv[t.offset : t.offset + t.nbytes] for t in manifest.tensors]


def pack(frames: list[bytes], chunk_bytes: int, shm_dir=None) -> WeightBlob:
    """The frames as one blob (shared memory with ``shm_dir``) with their manifest."""
    m = delta_manifest([len(f) for f in frames], chunk_bytes)
    blob = Blob(m.total_bytes, shm_dir)
    for t, f in zip(m.tensors, frames, strict=True):
        blob.view[t.offset : t.offset + t.nbytes] = f
    return WeightBlob(m, blob)


def encode(
    manifest: Manifest, new, *, version: int, base: Held | None, algo: str, shm_dir=None, level: int = 1,
) -> Encoded:
    """Digest the new version (laid out by ``manifest``) and, with a ``base`` of the same layout,
    encode the delta from it; the delta is dropped when it is not below ``MAX_SHARE`` of the full
    version (e.g. a float32 adapter that every step changes whole)."""
    chunks, digest = DV.version_digests(manifest, new, algo)
    if base is None or base.manifest != manifest:
        return Encoded(chunks, digest, None, 0)
    frames = DV.encode_version(manifest, base.view, new, base_version=base.version, version=version,
                              base_digest=base.digest, digest=digest, algo=algo, level=level)
    size = sum(len(f) for f in frames)
    if size >= MAX_SHARE * manifest.total_bytes:
        return Encoded(chunks, digest, None, size)
    return Encoded(chunks, digest, pack(frames, manifest.chunk_bytes, shm_dir), size)


def materialize(held: Held, manifest: Manifest, view, into) -> DV.Applied:
    """Write the version the delta in ``view`` (laid out by ``manifest``) leads to into ``into`` (a
    writable buffer of the held version's size): the held bytes, then the delta; raises
    ``DeltaError`` (a ``WeightError``) for a delta from another base, a damaged one, or a result
    whose digest is not the publisher's (``into`` then holds neither version)."""
    out = memoryview(into)
    if len(out) != held.manifest.total_bytes:
        raise WeightError("argument", f"a {len(out)}-byte buffer for a {held.manifest.total_bytes}-byte version")
    out[:] = held.view
    return DV.apply_version(held.manifest, out, frames_of(manifest, view), held_version=held.version,
                           held_digest=held.digest)
