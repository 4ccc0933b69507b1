from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InterruptRequest(_message.Message):
    __slots__ = ("request_tags",)
    REQUEST_TAGS_FIELD_NUMBER: _ClassVar[int]
    request_tags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_tags: _Optional[_Iterable[str]] = ...) -> None: ...

class InterruptReply(_message.Message):
    __slots__ = ("interrupted",)
    INTERRUPTED_FIELD_NUMBER: _ClassVar[int]
    interrupted: int
    def __init__(self, interrupted: _Optional[int] = ...) -> None: ...

class Prompt(_message.Message):
    __slots__ = ("prompt_id", "group_id", "token_ids", "estimated_length", "forced_length", "task", "forced_lengths")
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_LENGTH_FIELD_NUMBER: _ClassVar[int]
    FORCED_LENGTH_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    FORCED_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    prompt_id: str
    group_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    estimated_length: float
    forced_length: int
    task: str
    forced_lengths: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, prompt_id: _Optional[str] = ..., group_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., estimated_length: _Optional[float] = ..., forced_length: _Optional[int] = ..., task: _Optional[str] = ..., forced_lengths: _Optional[_Iterable[int]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompts", "samples_per_prompt", "max_new_tokens", "min_weight_version", "request_tag", "interruptible", "temperature", "top_p", "top_k", "seed")
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_PROMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MIN_WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_TAG_FIELD_NUMBER: _ClassVar[int]
    INTERRUPTIBLE_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    prompts: _containers.RepeatedCompositeFieldContainer[Prompt]
    samples_per_prompt: int
    max_new_tokens: int
    min_weight_version: int
    request_tag: str
    interruptible: bool
    temperature: float
    top_p: float
    top_k: int
    seed: int
    def __init__(self, prompts: _Optional[_Iterable[_Union[Prompt, _Mapping]]] = ..., samples_per_prompt: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., min_weight_version: _Optional[int] = ..., request_tag: _Optional[str] = ..., interruptible: _Optional[bool] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ...) -> None: ...

class Sample(_message.Message):
    __slots__ = ("prompt_id", "group_id", "sample_index", "prompt_token_ids", "token_ids", "logprobs", "weight_version", "finish_reason", "submitted_at", "started_at", "finished_at")
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    prompt_id: str
    group_id: str
    sample_index: int
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    weight_version: int
    finish_reason: str
    submitted_at: float
    started_at: float
    finished_at: float
    def __init__(self, prompt_id: _Optional[str] = ..., group_id: _Optional[str] = ..., sample_index: _Optional[int] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., weight_version: _Optional[int] = ..., finish_reason: _Optional[str] = ..., submitted_at: _Optional[float] = ..., started_at: _Optional[float] = ..., finished_at: _Optional[float] = ...) -> None: ...

class WeightChunk(_message.Message):
    __slots__ = ("version", "name", "dtype", "shape", "offset", "data", "tensor_bytes", "last", "digest", "index", "chunk_digest")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TENSOR_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    CHUNK_DIGEST_FIELD_NUMBER: _ClassVar[int]
    version: int
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    offset: int
    data: bytes
    tensor_bytes: int
    last: bool
    digest: str
    index: int
    chunk_digest: str
    def __init__(self, version: _Optional[int] = ..., name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., tensor_bytes: _Optional[int] = ..., last: _Optional[bool] = ..., digest: _Optional[str] = ..., index: _Optional[int] = ..., chunk_digest: _Optional[str] = ...) -> None: ...

class UpdateAck(_message.Message):
    __slots__ = ("version", "staged", "bytes", "tensors", "path", "delta_fallback", "fallback_reason")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STAGED_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    DELTA_FALLBACK_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_REASON_FIELD_NUMBER: _ClassVar[int]
    version: int
    staged: bool
    bytes: int
    tensors: int
    path: str
    delta_fallback: bool
    fallback_reason: str
    def __init__(self, version: _Optional[int] = ..., staged: _Optional[bool] = ..., bytes: _Optional[int] = ..., tensors: _Optional[int] = ..., path: _Optional[str] = ..., delta_fallback: _Optional[bool] = ..., fallback_reason: _Optional[str] = ...) -> None: ...

class HealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthReply(_message.Message):
    __slots__ = ("status", "weight_version", "pending_version", "running", "waiting", "finished", "kv_usage", "engine", "generated_tokens")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    PENDING_VERSION_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    KV_USAGE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    status: str
    weight_version: int
    pending_version: int
    running: int
    waiting: int
    finished: int
    kv_usage: float
    engine: str
    generated_tokens: int
    def __init__(self, status: _Optional[str] = ..., weight_version: _Optional[int] = ..., pending_version: _Optional[int] = ..., running: _Optional[int] = ..., waiting: _Optional[int] = ..., finished: _Optional[int] = ..., kv_usage: _Optional[float] = ..., engine: _Optional[str] = ..., generated_tokens: _Optional[int] = ...) -> None: ...

class InstanceRequest(_message.Message):
    __slots__ = ("address", "wait_s")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    address: str
    wait_s: float
    def __init__(self, address: _Optional[str] = ..., wait_s: _Optional[float] = ...) -> None: ...

class InstanceReply(_message.Message):
    __slots__ = ("instances", "weight_version", "drained")
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    DRAINED_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedScalarFieldContainer[str]
    weight_version: int
    drained: int
    def __init__(self, instances: _Optional[_Iterable[str]] = ..., weight_version: _Optional[int] = ..., drained: _Optional[int] = ...) -> None: ...

class PullWeightsRequest(_message.Message):
    __slots__ = ("version", "wait_s")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    version: int
    wait_s: float
    def __init__(self, version: _Optional[int] = ..., wait_s: _Optional[float] = ...) -> None: ...

class TensorEntry(_message.Message):
    __slots__ = ("name", "dtype", "shape", "nbytes", "offset")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    nbytes: int
    offset: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., nbytes: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class WeightManifest(_message.Message):
    __slots__ = ("version", "tensors", "chunk_bytes", "version_digest", "chunk_digests", "shm_path", "host_id", "delta", "delta_base")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    VERSION_DIGEST_FIELD_NUMBER: _ClassVar[int]
    CHUNK_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    SHM_PATH_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    DELTA_BASE_FIELD_NUMBER: _ClassVar[int]
    version: int
    tensors: _containers.RepeatedCompositeFieldContainer[TensorEntry]
    chunk_bytes: int
    version_digest: str
    chunk_digests: _containers.RepeatedScalarFieldContainer[str]
    shm_path: str
    host_id: str
    delta: bool
    delta_base: int
    def __init__(self, version: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[TensorEntry, _Mapping]]] = ..., chunk_bytes: _Optional[int] = ..., version_digest: _Optional[str] = ..., chunk_digests: _Optional[_Iterable[str]] = ..., shm_path: _Optional[str] = ..., host_id: _Optional[str] = ..., delta: _Optional[bool] = ..., delta_base: _Optional[int] = ...) -> None: ...

class PushMessage(_message.Message):
    __slots__ = ("manifest", "chunk", "part", "parts", "version_digest", "sender")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    VERSION_DIGEST_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    manifest: WeightManifest
    chunk: WeightChunk
    part: int
    parts: int
    version_digest: str
    sender: str
    def __init__(self, manifest: _Optional[_Union[WeightManifest, _Mapping]] = ..., chunk: _Optional[_Union[WeightChunk, _Mapping]] = ..., part: _Optional[int] = ..., parts: _Optional[int] = ..., version_digest: _Optional[str] = ..., sender: _Optional[str] = ...) -> None: ...

class PushAck(_message.Message):
    __slots__ = ("version", "committed", "bytes", "chunks")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    version: int
    committed: bool
    bytes: int
    chunks: int
    def __init__(self, version: _Optional[int] = ..., committed: _Optional[bool] = ..., bytes: _Optional[int] = ..., chunks: _Optional[int] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("version", "from_chunk", "part", "parts", "allow_shm", "host_id", "wait_s", "to_chunk", "head_only", "delta_ok", "have_version", "have_digest")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FROM_CHUNK_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_SHM_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    TO_CHUNK_FIELD_NUMBER: _ClassVar[int]
    HEAD_ONLY_FIELD_NUMBER: _ClassVar[int]
    DELTA_OK_FIELD_NUMBER: _ClassVar[int]
    HAVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    HAVE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    version: int
    from_chunk: int
    part: int
    parts: int
    allow_shm: bool
    host_id: str
    wait_s: float
    to_chunk: int
    head_only: bool
    delta_ok: bool
    have_version: int
    have_digest: str
    def __init__(self, version: _Optional[int] = ..., from_chunk: _Optional[int] = ..., part: _Optional[int] = ..., parts: _Optional[int] = ..., allow_shm: _Optional[bool] = ..., host_id: _Optional[str] = ..., wait_s: _Optional[float] = ..., to_chunk: _Optional[int] = ..., head_only: _Optional[bool] = ..., delta_ok: _Optional[bool] = ..., have_version: _Optional[int] = ..., have_digest: _Optional[str] = ...) -> None: ...

class PullMessage(_message.Message):
    __slots__ = ("manifest", "chunk")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    manifest: WeightManifest
    chunk: WeightChunk
    def __init__(self, manifest: _Optional[_Union[WeightManifest, _Mapping]] = ..., chunk: _Optional[_Union[WeightChunk, _Mapping]] = ...) -> None: ...

class VersionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class VersionInfo(_message.Message):
    __slots__ = ("version", "bytes", "chunks", "digest", "complete", "received", "fingerprint", "committed_at", "delta", "delta_base")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    DELTA_BASE_FIELD_NUMBER: _ClassVar[int]
    version: int
    bytes: int
    chunks: int
    digest: str
    complete: bool
    received: int
    fingerprint: str
    committed_at: float
    delta: bool
    delta_base: int
    def __init__(self, version: _Optional[int] = ..., bytes: _Optional[int] = ..., chunks: _Optional[int] = ..., digest: _Optional[str] = ..., complete: _Optional[bool] = ..., received: _Optional[int] = ..., fingerprint: _Optional[str] = ..., committed_at: _Optional[float] = ..., delta: _Optional[bool] = ..., delta_base: _Optional[int] = ...) -> None: ...

class VersionsReply(_message.Message):
    __slots__ = ("relay_id", "versions", "latest", "downstream", "host_id")
    RELAY_ID_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    DOWNSTREAM_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    relay_id: str
    versions: _containers.RepeatedCompositeFieldContainer[VersionInfo]
    latest: int
    downstream: _containers.RepeatedScalarFieldContainer[str]
    host_id: str
    def __init__(self, relay_id: _Optional[str] = ..., versions: _Optional[_Iterable[_Union[VersionInfo, _Mapping]]] = ..., latest: _Optional[int] = ..., downstream: _Optional[_Iterable[str]] = ..., host_id: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("caller",)
    CALLER_FIELD_NUMBER: _ClassVar[int]
    caller: str
    def __init__(self, caller: _Optional[str] = ...) -> None: ...

class Branch(_message.Message):
    __slots__ = ("relays",)
    RELAYS_FIELD_NUMBER: _ClassVar[int]
    relays: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, relays: _Optional[_Iterable[str]] = ...) -> None: ...

class ChainRequest(_message.Message):
    __slots__ = ("epoch", "branches", "upstream")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    BRANCHES_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    branches: _containers.RepeatedCompositeFieldContainer[Branch]
    upstream: str
    def __init__(self, epoch: _Optional[int] = ..., branches: _Optional[_Iterable[_Union[Branch, _Mapping]]] = ..., upstream: _Optional[str] = ...) -> None: ...

class ChainReply(_message.Message):
    __slots__ = ("epoch",)
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    def __init__(self, epoch: _Optional[int] = ...) -> None: ...

class TransferRequest(_message.Message):
    __slots__ = ("direction", "version", "manifest", "from_chunk", "to_chunk", "wait_s", "sender", "delta_ok", "have_version", "have_digest")
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    FROM_CHUNK_FIELD_NUMBER: _ClassVar[int]
    TO_CHUNK_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    DELTA_OK_FIELD_NUMBER: _ClassVar[int]
    HAVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    HAVE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    direction: str
    version: int
    manifest: WeightManifest
    from_chunk: int
    to_chunk: int
    wait_s: float
    sender: str
    delta_ok: bool
    have_version: int
    have_digest: str
    def __init__(self, direction: _Optional[str] = ..., version: _Optional[int] = ..., manifest: _Optional[_Union[WeightManifest, _Mapping]] = ..., from_chunk: _Optional[int] = ..., to_chunk: _Optional[int] = ..., wait_s: _Optional[float] = ..., sender: _Optional[str] = ..., delta_ok: _Optional[bool] = ..., have_version: _Optional[int] = ..., have_digest: _Optional[str] = ...) -> None: ...

class TransferGrant(_message.Message):
    __slots__ = ("token", "port", "tls_port", "ttl_s", "version", "manifest", "from_chunk")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    TLS_PORT_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    FROM_CHUNK_FIELD_NUMBER: _ClassVar[int]
    token: bytes
    port: int
    tls_port: int
    ttl_s: float
    version: int
    manifest: WeightManifest
    from_chunk: int
    def __init__(self, token: _Optional[bytes] = ..., port: _Optional[int] = ..., tls_port: _Optional[int] = ..., ttl_s: _Optional[float] = ..., version: _Optional[int] = ..., manifest: _Optional[_Union[WeightManifest, _Mapping]] = ..., from_chunk: _Optional[int] = ...) -> None: ...

class ResetRequest(_message.Message):
    __slots__ = ("kind", "seed", "trajectory_id")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    kind: str
    seed: int
    trajectory_id: str
    def __init__(self, kind: _Optional[str] = ..., seed: _Optional[int] = ..., trajectory_id: _Optional[str] = ...) -> None: ...

class ResetReply(_message.Message):
    __slots__ = ("session_id", "observation")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    observation: str
    def __init__(self, session_id: _Optional[str] = ..., observation: _Optional[str] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("session_id", "turn", "action")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    turn: int
    action: str
    def __init__(self, session_id: _Optional[str] = ..., turn: _Optional[int] = ..., action: _Optional[str] = ...) -> None: ...

class StepReply(_message.Message):
    __slots__ = ("observation", "reward", "done", "info", "turn", "latency_s", "step_s")
    class InfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    LATENCY_S_FIELD_NUMBER: _ClassVar[int]
    STEP_S_FIELD_NUMBER: _ClassVar[int]
    observation: str
    reward: float
    done: bool
    info: _containers.ScalarMap[str, str]
    turn: int
    latency_s: float
    step_s: float
    def __init__(self, observation: _Optional[str] = ..., reward: _Optional[float] = ..., done: _Optional[bool] = ..., info: _Optional[_Mapping[str, str]] = ..., turn: _Optional[int] = ..., latency_s: _Optional[float] = ..., step_s: _Optional[float] = ...) -> None: ...

class CloseRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseReply(_message.Message):
    __slots__ = ("turns",)
    TURNS_FIELD_NUMBER: _ClassVar[int]
    turns: int
    def __init__(self, turns: _Optional[int] = ...) -> None: ...

class EnvHealthReply(_message.Message):
    __slots__ = ("worker_id", "sessions", "steps", "kinds")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    sessions: int
    steps: int
    kinds: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, worker_id: _Optional[str] = ..., sessions: _Optional[int] = ..., steps: _Optional[int] = ..., kinds: _Optional[_Iterable[str]] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("request_id", "task", "seed", "prompt", "actions", "observations", "reference", "row_json")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    ROW_JSON_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    task: str
    seed: int
    prompt: str
    actions: _containers.RepeatedScalarFieldContainer[str]
    observations: _containers.RepeatedScalarFieldContainer[str]
    reference: str
    row_json: str
    def __init__(self, request_id: _Optional[str] = ..., task: _Optional[str] = ..., seed: _Optional[int] = ..., prompt: _Optional[str] = ..., actions: _Optional[_Iterable[str]] = ..., observations: _Optional[_Iterable[str]] = ..., reference: _Optional[str] = ..., row_json: _Optional[str] = ...) -> None: ...

class ScoreReply(_message.Message):
    __slots__ = ("reward", "kind", "info", "worker", "score_s")
    class InfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REWARD_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    SCORE_S_FIELD_NUMBER: _ClassVar[int]
    reward: float
    kind: str
    info: _containers.ScalarMap[str, str]
    worker: str
    score_s: float
    def __init__(self, reward: _Optional[float] = ..., kind: _Optional[str] = ..., info: _Optional[_Mapping[str, str]] = ..., worker: _Optional[str] = ..., score_s: _Optional[float] = ...) -> None: ...

class RewardHealthReply(_message.Message):
    __slots__ = ("worker_id", "kind", "threads", "in_flight", "queued", "served", "busy_s", "max_queue")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    SERVED_FIELD_NUMBER: _ClassVar[int]
    BUSY_S_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    kind: str
    threads: int
    in_flight: int
    queued: int
    served: int
    busy_s: float
    max_queue: int
    def __init__(self, worker_id: _Optional[str] = ..., kind: _Optional[str] = ..., threads: _Optional[int] = ..., in_flight: _Optional[int] = ..., queued: _Optional[int] = ..., served: _Optional[int] = ..., busy_s: _Optional[float] = ..., max_queue: _Optional[int] = ...) -> None: ...
