from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Prompt(_message.Message):
    __slots__ = ("prompt_id", "group_id", "token_ids", "estimated_length", "forced_length")
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_LENGTH_FIELD_NUMBER: _ClassVar[int]
    FORCED_LENGTH_FIELD_NUMBER: _ClassVar[int]
    prompt_id: str
    group_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    estimated_length: float
    forced_length: int
    def __init__(self, prompt_id: _Optional[str] = ..., group_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., estimated_length: _Optional[float] = ..., forced_length: _Optional[int] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompts", "samples_per_prompt", "max_new_tokens", "min_weight_version", "request_tag", "interruptible")
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_PROMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MIN_WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_TAG_FIELD_NUMBER: _ClassVar[int]
    INTERRUPTIBLE_FIELD_NUMBER: _ClassVar[int]
    prompts: _containers.RepeatedCompositeFieldContainer[Prompt]
    samples_per_prompt: int
    max_new_tokens: int
    min_weight_version: int
    request_tag: str
    interruptible: bool
    def __init__(self, prompts: _Optional[_Iterable[_Union[Prompt, _Mapping]]] = ..., samples_per_prompt: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., min_weight_version: _Optional[int] = ..., request_tag: _Optional[str] = ..., interruptible: _Optional[bool] = ...) -> None: ...

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
    __slots__ = ("version", "name", "dtype", "shape", "offset", "data", "tensor_bytes", "last", "digest")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TENSOR_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    version: int
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    offset: int
    data: bytes
    tensor_bytes: int
    last: bool
    digest: str
    def __init__(self, version: _Optional[int] = ..., name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., tensor_bytes: _Optional[int] = ..., last: _Optional[bool] = ..., digest: _Optional[str] = ...) -> None: ...

class UpdateAck(_message.Message):
    __slots__ = ("version", "staged", "bytes", "tensors")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STAGED_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    version: int
    staged: bool
    bytes: int
    tensors: int
    def __init__(self, version: _Optional[int] = ..., staged: _Optional[bool] = ..., bytes: _Optional[int] = ..., tensors: _Optional[int] = ...) -> None: ...

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
