"""Protobuf <-> dataclass conversion for the Generation service (the only place pb2 meets them)."""

from __future__ import annotations

from services.common.types import GenerateParams, HealthSnapshot, PromptSpec, SampleRecord
from services.common.weights import Chunk
from services.proto import braid_pb2 as pb


def request_to_pb(prompts: list[PromptSpec], params: GenerateParams) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        prompts=[pb.Prompt(prompt_id=p.prompt_id, group_id=p.group_id, token_ids=list(p.token_ids)) for p in prompts],
        samples_per_prompt=params.samples_per_prompt,
        max_new_tokens=params.max_new_tokens,
        min_weight_version=params.min_weight_version,
        request_tag=params.tag,
    )


def request_from_pb(req: pb.GenerateRequest) -> tuple[list[PromptSpec], GenerateParams]:
    prompts = [PromptSpec(p.prompt_id, tuple(p.token_ids), p.group_id) for p in req.prompts]
    params = GenerateParams(
        samples_per_prompt=req.samples_per_prompt,
        max_new_tokens=req.max_new_tokens,
        min_weight_version=req.min_weight_version,
        tag=req.request_tag,
    )
    return prompts, params


def sample_to_pb(s: SampleRecord) -> pb.Sample:
    return pb.Sample(
        prompt_id=s.prompt_id,
        group_id=s.group_id,
        sample_index=s.sample_index,
        prompt_token_ids=list(s.prompt_token_ids),
        token_ids=list(s.token_ids),
        logprobs=list(s.logprobs),
        weight_version=s.weight_version,
        finish_reason=s.finish_reason,
        submitted_at=s.submitted_at,
        started_at=s.started_at,
        finished_at=s.finished_at,
    )


def sample_from_pb(s: pb.Sample) -> SampleRecord:
    return SampleRecord(
        prompt_id=s.prompt_id,
        group_id=s.group_id,
        sample_index=s.sample_index,
        prompt_token_ids=tuple(s.prompt_token_ids),
        token_ids=tuple(s.token_ids),
        logprobs=tuple(s.logprobs),
        weight_version=s.weight_version,
        finish_reason=s.finish_reason,
        submitted_at=s.submitted_at,
        started_at=s.started_at,
        finished_at=s.finished_at,
    )


def chunk_to_pb(c: Chunk) -> pb.WeightChunk:
    return pb.WeightChunk(
        version=c.version,
        name=c.name,
        dtype=c.dtype,
        shape=list(c.shape),
        offset=c.offset,
        data=c.data,
        tensor_bytes=c.tensor_bytes,
        last=c.last,
        digest=c.digest,
    )


def chunk_from_pb(c: pb.WeightChunk) -> Chunk:
    return Chunk(
        version=c.version,
        name=c.name,
        dtype=c.dtype,
        shape=tuple(c.shape),
        offset=c.offset,
        data=c.data,
        tensor_bytes=c.tensor_bytes,
        last=c.last,
        digest=c.digest,
    )


def health_to_pb(h: HealthSnapshot) -> pb.HealthReply:
    return pb.HealthReply(**h.__dict__)


def health_from_pb(h: pb.HealthReply) -> HealthSnapshot:
    return HealthSnapshot(
        status=h.status,
        weight_version=h.weight_version,
        pending_version=h.pending_version,
        running=h.running,
        waiting=h.waiting,
        finished=h.finished,
        kv_usage=h.kv_usage,
        engine=h.engine,
        generated_tokens=h.generated_tokens,
    )
