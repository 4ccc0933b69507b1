"""Weight versions as chunk streams: split a state dict, reassemble and validate it.

A version travels as a sequence of chunks, tensor after tensor, each chunk a slice of one
tensor's bytes with its name, dtype, shape and byte offset. The last chunk carries a SHA-256
digest over every data byte in stream order. The assembler checks each chunk against the
receiver's parameter specs (unknown name, wrong shape or dtype, gaps, overlong data) and the
digest at the end, and raises ``WeightError`` naming what is wrong. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class TensorSpec:
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * torch.empty((), dtype=_DTYPES[self.dtype]).element_size()


@dataclass(frozen=True)
class Chunk:
    version: int
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    data: bytes
    tensor_bytes: int
    last: bool = False
    digest: str = ""


class WeightError(ValueError):
    """A weight stream is invalid. ``kind`` is one of: argument, precondition, integrity."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def specs_of(state: dict[str, torch.Tensor]) -> dict[str, TensorSpec]:
    return {k: TensorSpec(dtype_name(v.dtype), tuple(v.shape)) for k, v in state.items()}


def iter_chunks(state: dict[str, torch.Tensor], version: int, chunk_bytes: int) -> Iterator[Chunk]:
    """Split ``state`` into chunks of at most ``chunk_bytes`` data bytes; the last one carries
    the digest. Tensors are made contiguous and copied to bytes one chunk at a time."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    digest = hashlib.sha256()
    items = list(state.items())
    for i, (name, tensor) in enumerate(items):
        flat = tensor.detach().contiguous().view(-1).view(torch.uint8)
        total = flat.numel()
        offsets = range(0, total, chunk_bytes) if total else [0]
        for offset in offsets:
            data = flat[offset : offset + chunk_bytes].numpy().tobytes()
            digest.update(data)
            last = i == len(items) - 1 and offset + chunk_bytes >= total
            yield Chunk(
                version=version,
                name=name,
                dtype=dtype_name(tensor.dtype),
                shape=tuple(tensor.shape),
                offset=offset,
                data=data,
                tensor_bytes=total,
                last=last,
                digest=digest.hexdigest() if last else "",
            )


class WeightAssembler:
    """Reassembles one version from chunks, validating as it goes."""

    def __init__(self, specs: dict[str, TensorSpec], installed_version: int) -> None:
        self._specs = specs
        self._installed = installed_version
        self._buffers: dict[str, bytearray] = {}
        self._digest = hashlib.sha256()
        self._version: int | None = None
        self._done = False
        self.bytes = 0

    def add(self, chunk: Chunk) -> None:
        if self._done:
            raise WeightError("argument", "chunk received after the last chunk")
        self._check_version(chunk.version)
        spec = self._specs.get(chunk.name)
        if spec is None:
            raise WeightError("argument", f"unknown parameter {chunk.name!r}")
        if chunk.dtype != spec.dtype or tuple(chunk.shape) != spec.shape:
            raise WeightError(
                "argument",
                f"parameter {chunk.name!r}: got dtype {chunk.dtype} shape {list(chunk.shape)}, "
                f"expected dtype {spec.dtype} shape {list(spec.shape)}",
            )
        if chunk.tensor_bytes != spec.nbytes:
            raise WeightError("argument", f"parameter {chunk.name!r}: tensor_bytes {chunk.tensor_bytes} != {spec.nbytes}")
        buf = self._buffers.setdefault(chunk.name, bytearray())
        if chunk.offset != len(buf):
            raise WeightError("argument", f"parameter {chunk.name!r}: chunk at offset {chunk.offset}, expected {len(buf)}")
        if len(buf) + len(chunk.data) > spec.nbytes:
            raise WeightError("argument", f"parameter {chunk.name!r}: more than {spec.nbytes} bytes")
        buf.extend(chunk.data)
        self._digest.update(chunk.data)
        self.bytes += len(chunk.data)
        if chunk.last:
            self._done = True
            if chunk.digest != self._digest.hexdigest():
                raise WeightError("integrity", f"digest mismatch for version {chunk.version}: data corrupted in transit")

    def _check_version(self, version: int) -> None:
        if self._version is None:
            if version <= self._installed:
                raise WeightError(
                    "precondition", f"version {version} is not newer than the installed version {self._installed}"
                )
            self._version = version
        elif version != self._version:
            raise WeightError("argument", f"chunks of versions {self._version} and {version} mixed in one stream")

    def finish(self) -> tuple[int, dict[str, torch.Tensor]]:
        """Return (version, state dict); raises if the stream was incomplete."""
        if not self._done or self._version is None:
            raise WeightError("argument", "stream ended before the last chunk")
        missing = [n for n, s in self._specs.items() if len(self._buffers.get(n, b"")) != s.nbytes]
        if missing:
            raise WeightError("argument", f"incomplete version {self._version}: missing or short {missing[:5]}")
        state = {}
        for name, spec in self._specs.items():
            if spec.nbytes == 0:
                state[name] = torch.empty(spec.shape, dtype=_DTYPES[spec.dtype])
                continue
            flat = torch.frombuffer(self._buffers[name], dtype=_DTYPES[spec.dtype])
            state[name] = flat.view(spec.shape)
        return self._version, state
