"""Protobuf <-> dataclass conversion for the Generation service (the only place pb2 meets them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields

from services.common.types import SEED_LIMIT, GenerateParams, HealthSnapshot, PromptSpec, SampleRecord
from services.common.weights import Chunk
from services.proto import braid_pb2 as pb


def request_to_pb(prompts: list[PromptSpec], params: GenerateParams) -> pb.GenerateRequest:
    """The wire request; ``ValueError`` for a seed the wire cannot carry (it is a uint64)."""
    if params.seed is not None and not 0 <= params.seed < SEED_LIMIT:
        raise ValueError(f"GenerateParams.seed {params.seed} out of range: a seed is an unsigned 64-bit integer "
                         "[0, 2**64), or None")
    return pb.GenerateRequest(
        prompts=[
            pb.Prompt(
                prompt_id=p.prompt_id, group_id=p.group_id, token_ids=list(p.token_ids),
                estimated_length=p.estimated_length, forced_length=p.forced_length, task=p.task,
                forced_lengths=list(p.forced_lengths),
            )
            for p in prompts
        ],
        samples_per_prompt=params.samples_per_prompt,
        max_new_tokens=params.max_new_tokens,
        min_weight_version=params.min_weight_version,
        request_tag=params.tag,
        interruptible=params.interruptible,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        seed=params.seed,  # None leaves the presence field unset
    )


def request_from_pb(req: pb.GenerateRequest) -> tuple[list[PromptSpec], GenerateParams]:
    prompts = [
        PromptSpec(p.prompt_id, tuple(p.token_ids), p.group_id, p.estimated_length, p.forced_length, p.task,
                   tuple(p.forced_lengths))
        for p in req.prompts
    ]
    params = GenerateParams(
        samples_per_prompt=req.samples_per_prompt,
        max_new_tokens=req.max_new_tokens,
        min_weight_version=req.min_weight_version,
        tag=req.request_tag,
        interruptible=req.interruptible,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        seed=req.seed if req.HasField("seed") else None,
    )
    return prompts, params


# Dataclass fields that never cross the wire: a trajectory's loss mask is the trainer's, built
# after generation (the SGS streams generated tokens only).
LOCAL_ONLY = frozenset({"loss_mask"})


def _to_pb(message_cls, obj):
    """Dataclass -> protobuf message with the same field names."""
    if getattr(obj, "loss_mask", ()):
        raise ValueError(f"{type(obj).__name__} with a loss mask is a training sample, not a wire message")
    return message_cls(**{f.name: getattr(obj, f.name) for f in fields(obj) if f.name not in LOCAL_ONLY})


def _from_pb(cls, message):
    """Protobuf message -> dataclass ``cls`` with the same field names (repeated -> tuple)."""
    values = {}
    for f in fields(cls):
        if f.name in LOCAL_ONLY:
            continue
        value = getattr(message, f.name)
        repeated = isinstance(value, Sequence) and not isinstance(value, (str, bytes))
        values[f.name] = tuple(value) if repeated else value
    return cls(**values)


def sample_to_pb(s: SampleRecord) -> pb.Sample:
    return _to_pb(pb.Sample, s)


def sample_from_pb(s: pb.Sample) -> SampleRecord:
    return _from_pb(SampleRecord, s)


def chunk_to_pb(c: Chunk) -> pb.WeightChunk:
    return _to_pb(pb.WeightChunk, c)


def chunk_from_pb(c: pb.WeightChunk) -> Chunk:
    return _from_pb(Chunk, c)


def health_to_pb(h: HealthSnapshot) -> pb.HealthReply:
    return _to_pb(pb.HealthReply, h)


def health_from_pb(h: pb.HealthReply) -> HealthSnapshot:
    return _from_pb(HealthSnapshot, h)
