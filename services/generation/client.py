"""Client of the Stream Generation Service; speaks dataclasses, hides protobuf.

Plaintext by default (a site's own processes on loopback); with ``tls`` (this site's
``TlsFiles``) it reaches another site's SGS or router over mutual TLS.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import torch

from services.common.certs import TlsFiles
from services.common.rpc import MB, connect
from services.common.types import GenerateParams, HealthSnapshot, PromptSpec, SampleRecord
from services.common.weights import iter_chunks
from services.generation import convert
from services.proto import braid_pb2 as pb
from services.proto import braid_pb2_grpc as pb_grpc


class GenerateCall:
    """One server-streaming Generate call. ``cancel`` stops it on the server too (its running
    samples are dropped); a cancelled call's iterator ends instead of raising."""

    def __init__(self, rendezvous) -> None:
        self._call = rendezvous
        self.cancelled = False

    def __iter__(self) -> Iterator[SampleRecord]:
        try:
            for sample in self._call:
                yield convert.sample_from_pb(sample)
        except grpc.RpcError as err:
            if not (self.cancelled and err.code() == grpc.StatusCode.CANCELLED):
                raise

    def cancel(self) -> None:
        self.cancelled = True
        self._call.cancel()


class GenerationClient:
    def __init__(
        self, address: str, *, max_message_mb: int = 64, timeout_s: float = 3600.0, tls: TlsFiles | None = None
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._channel = connect(address, max_message_bytes=max_message_mb * MB, tls=tls)
        self._stub = pb_grpc.GenerationStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> GenerationClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_ready(self, timeout_s: float = 60.0) -> HealthSnapshot:
        """Poll Health until the service answers (retrying only on UNAVAILABLE)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.health()
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def health(self, timeout_s: float = 10.0) -> HealthSnapshot:
        return convert.health_from_pb(self._stub.Health(pb.HealthRequest(), timeout=timeout_s))

    def kv_state(self, timeout_s: float = 2.0) -> tuple[float, int] | None:
        """(KV-cache fraction in use, samples queued) from Health; None when it does not answer
        (what ``least_tokens`` dispatch measures; a lost instance is someone else's to detect)."""
        try:
            h = self.health(timeout_s)
        except grpc.RpcError:
            return None
        return h.kv_usage, h.waiting

    def generate(self, prompts: list[PromptSpec], params: GenerateParams) -> Iterator[SampleRecord]:
        """Stream samples in completion order. Cancel by closing the iterator."""
        call = self.start(prompts, params)
        try:
            yield from call
        finally:
            call.cancel()

    def start(self, prompts: list[PromptSpec], params: GenerateParams) -> GenerateCall:
        """Start a Generate call; iterate it for samples, ``cancel()`` it from any thread."""
        return GenerateCall(self._stub.Generate(convert.request_to_pb(prompts, params), timeout=self.timeout_s))

    def interrupt(self, tags: list[str], timeout_s: float = 30.0) -> int:
        """Interrupt the calls started with these ``GenerateParams.tag`` values: their samples come
        back on their streams with finish_reason "interrupted"; returns how many."""
        return self._stub.Interrupt(pb.InterruptRequest(request_tags=tags), timeout=timeout_s).interrupted

    def pull_weights(self, version: int = -1, *, wait_s: float = 0.0) -> pb.UpdateAck:
        """Tell the instance to pull ``version`` (-1 = latest) from its relay and stage it."""
        return self._stub.PullWeights(pb.PullWeightsRequest(version=version, wait_s=wait_s), timeout=wait_s + 600)

    def add_instance(self, address: str, *, wait_s: float = 60.0) -> tuple[list[str], int]:
        """Router only: route to the instance at ``address`` from now on (after it took the current
        weights); return (the router's instances, the weight version the new one reported)."""
        reply = self._stub.AddInstance(pb.InstanceRequest(address=address, wait_s=wait_s), timeout=2 * wait_s + 60)
        return list(reply.instances), int(reply.weight_version)

    def remove_instance(self, address: str, *, wait_s: float = 600.0) -> tuple[list[str], int]:
        """Router only: stop routing to ``address`` once it finished its in-flight work; return
        (the router's instances, the sequences it finished meanwhile)."""
        reply = self._stub.RemoveInstance(pb.InstanceRequest(address=address, wait_s=wait_s), timeout=wait_s + 60)
        return list(reply.instances), int(reply.drained)

    def update_weights(
        self, state: dict[str, torch.Tensor], version: int, *, chunk_bytes: int = 1 << 20
    ) -> pb.UpdateAck:
        chunks = (convert.chunk_to_pb(c) for c in iter_chunks(state, version, chunk_bytes))
        return self._stub.UpdateWeights(chunks, timeout=600)


def push_chunks(client: GenerationClient, chunks: Iterator[pb.WeightChunk], timeout_s: float = 600) -> pb.UpdateAck:
    """Forward an already-encoded weight stream (the router's fan-out) to ``client``'s service."""
    return client._stub.UpdateWeights(chunks, timeout=timeout_s)
