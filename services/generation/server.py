"""Stream Generation Service: the gRPC edge over ``GenerationCore``.

Validates every request and answers bad ones with a clear status (INVALID_ARGUMENT for
malformed input, FAILED_PRECONDITION for a stale weight version, DATA_LOSS for a digest
mismatch, RESOURCE_EXHAUSTED for oversized messages), converts protobuf to dataclasses, and
streams each finished sample back as soon as the core delivers it. A weight version (pushed, or
pulled from a relay) must be exactly the engine's ``param_specs``: full weights, or with
``trainer.lora`` the adapter's tensors only; the other kind is refused saying which this one takes.
Serves plaintext, or mutual TLS only with ``create_server(..., tls=...)`` (``--tls-dir/--tls-site``:
another site's callers).
"""

from __future__ import annotations

import logging
import math
import queue
import threading
from concurrent import futures

import grpc

from services.common.certs import TlsFiles
from services.common.config import GenerationConfig
from services.common.pool_config import task_problem
from services.common.rpc import MB, bind, new_server
from services.common.types import GenerateParams, PromptSpec
from services.common.weights import TensorSpec, WeightAssembler, WeightError
from services.generation import convert
from services.generation.core import CallClosed, GenerationCore
from services.generation.engine import Sampling
from services.proto import braid_pb2 as pb
from services.proto import braid_pb2_grpc as pb_grpc
from services.weights.wire import WEIGHT_ERROR_CODES

log = logging.getLogger("braid.sgs")

_WEIGHT_CODES = WEIGHT_ERROR_CODES
MAX_ID_CHARS = 256
MAX_SAMPLES_PER_PROMPT = 1024


MAX_WAIT_S = 86400.0


class RequestError(ValueError):
    pass


def weights_kind(specs: dict[str, TensorSpec]) -> str:
    """What this instance takes as a weight version, in words (added to a refusal of other tensors)."""
    example = next(iter(specs), "")
    if specs and all(".lora_" in name for name in specs):
        return (f"this SGS serves base + a LoRA adapter (trainer.lora): a weight version is the adapter's {len(specs)} "
                f"tensors only (e.g. {example!r}), not full weights")
    return (f"this SGS serves full weights: a weight version is the model's {len(specs)} tensors (e.g. {example!r}); "
            "to serve LoRA adapters set trainer.lora in its config")


def _explained(err: WeightError, specs: dict[str, TensorSpec]) -> WeightError:
    """``err``, naming what this instance takes when the version held other tensors than its specs."""
    text = str(err)
    if err.kind == "argument" and (text.startswith(("unknown parameter", "incomplete version"))
                                   or "different model's parameters" in text):
        return WeightError(err.kind, f"{text}; {weights_kind(specs)}")
    return err


def pull_problem(request: pb.PullWeightsRequest) -> str | None:
    """Why a ``PullWeights`` request is malformed (NaN or negative wait, version below -1), or None."""
    if request.version < -1 or not 0 <= request.wait_s <= MAX_WAIT_S:
        return f"version must be >= -1 and wait_s in [0, {MAX_WAIT_S:.0f}], got {request.version}, {request.wait_s}"
    return None


def _check_forced(p: PromptSpec, samples: int, cfg) -> None:
    """A prompt's forced lengths (one for all its samples, or one per sample): only where the service
    accepts them, each within its limit."""
    if not (p.forced_length or p.forced_lengths):
        return
    if not cfg.forced_lengths:
        raise RequestError(f"prompt {p.prompt_id!r} sets forced lengths, but this service does not accept them "
                           "(generation.forced_lengths is false)")
    if p.forced_lengths and len(p.forced_lengths) != samples:
        raise RequestError(f"prompt {p.prompt_id!r}: {len(p.forced_lengths)} forced_lengths for {samples} samples "
                           "(one per sample)")
    for n in p.forced_lengths or (p.forced_length,):
        if not 1 <= n <= cfg.max_new_tokens:
            raise RequestError(f"prompt {p.prompt_id!r}: forced length {n} is outside the service's limits "
                               f"[1, {cfg.max_new_tokens}]")


def validate_request(
    prompts: list[PromptSpec],
    params: GenerateParams,
    cfg: GenerationConfig,
    *,
    vocab_size: int,
    max_positions: int,
    kv_capacity: int = 0,
) -> None:
    """Raise ``RequestError`` with a precise message if the request cannot be served
    (``kv_capacity``: tokens the engine's KV cache holds, 0 = unknown)."""
    if not prompts:
        raise RequestError("request has no prompts")
    if not 1 <= params.samples_per_prompt <= MAX_SAMPLES_PER_PROMPT:
        raise RequestError(
            f"samples_per_prompt must be in [1, {MAX_SAMPLES_PER_PROMPT}], got {params.samples_per_prompt}"
        )
    total = len(prompts) * params.samples_per_prompt
    if total > cfg.max_sequences_per_request:
        raise RequestError(f"request asks for {total} sequences; the limit is {cfg.max_sequences_per_request}")
    if params.max_new_tokens > cfg.max_new_tokens:
        raise RequestError(f"max_new_tokens {params.max_new_tokens} exceeds the service limit {cfg.max_new_tokens}")
    if (why := Sampling(params.temperature, params.top_p, params.top_k, params.seed).problem(vocab_size)) is not None:
        raise RequestError(why)
    if params.min_weight_version < 0:
        raise RequestError(f"min_weight_version must be >= 0, got {params.min_weight_version}")
    max_new = params.max_new_tokens or cfg.max_new_tokens
    seen: set[str] = set()
    for p in prompts:
        if not p.prompt_id or len(p.prompt_id) > MAX_ID_CHARS:
            raise RequestError(f"prompt_id must be 1..{MAX_ID_CHARS} characters, got {p.prompt_id[:40]!r}")
        if p.prompt_id in seen:
            raise RequestError(f"duplicate prompt_id {p.prompt_id!r}")
        seen.add(p.prompt_id)
        if len(p.group_id) > MAX_ID_CHARS:
            raise RequestError(f"group_id of {p.prompt_id!r} is longer than {MAX_ID_CHARS} characters")
        if (why := task_problem(p.task)) is not None:
            raise RequestError(f"prompt {p.prompt_id!r}: {why}")
        if not p.token_ids:
            raise RequestError(f"prompt {p.prompt_id!r} has no tokens")
        # a resumed trajectory (partial rollout, migration, a lost instance) sends its prompt with
        # what it generated so far: the limit is a prompt plus a whole response
        limit = cfg.max_prompt_tokens + cfg.max_new_tokens
        if len(p.token_ids) > limit:
            raise RequestError(
                f"prompt {p.prompt_id!r} has {len(p.token_ids)} tokens; the limit is {limit} "
                f"(generation.max_prompt_tokens {cfg.max_prompt_tokens} + max_new_tokens {cfg.max_new_tokens}: "
                "a resumed trajectory's prompt holds its output so far)"
            )
        if not math.isfinite(p.estimated_length) or p.estimated_length < 0:
            raise RequestError(
                f"prompt {p.prompt_id!r}: estimated_length must be finite and >= 0, got {p.estimated_length}"
            )
        _check_forced(p, params.samples_per_prompt, cfg)
        new = max(p.forced_lengths) if p.forced_lengths else (p.forced_length or max_new)
        if len(p.token_ids) + new > max_positions:
            raise RequestError(
                f"prompt {p.prompt_id!r}: {len(p.token_ids)} tokens + {new} new exceed the model's {max_positions} "
                "positions"
            )
        if kv_capacity and len(p.token_ids) + new > kv_capacity:
            raise RequestError(
                f"prompt {p.prompt_id!r}: {len(p.token_ids)} tokens + {new} new exceed the engine's whole KV cache "
                f"({kv_capacity} tokens = generation.num_blocks x page_size): it could never run"
            )
        bad = [t for t in p.token_ids if not 0 <= t < vocab_size]
        if bad:
            raise RequestError(f"prompt {p.prompt_id!r} has token ids outside [0, {vocab_size}): {bad[:5]}")


MAX_INTERRUPT_TAGS = 4096
MAX_TAG_CHARS = 256


class GenerationServicer(pb_grpc.GenerationServicer):
    def __init__(
        self, core: GenerationCore, cfg: GenerationConfig, *, vocab_size: int, max_positions: int,
        relay=None, relay_streams: int = 1, pull_wait_s: float = 300.0, delta: bool = False,
    ) -> None:
        """``delta`` (``weights.delta``): keep the version pulled last and ask the relay for the next
        as the delta from it."""
        self.core = core
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.max_positions = max_positions
        self.relay = relay  # services.weights.client.RelayClient of this instance's local relay, or None
        self.relay_streams = relay_streams
        self.pull_wait_s = pull_wait_s
        self._pull_lock = threading.Lock()
        self.delta = delta
        self._held = None  # the version pulled last (delta_blob.Held): the base of the next delta

    def Generate(self, request: pb.GenerateRequest, context: grpc.ServicerContext):
        prompts, params = convert.request_from_pb(request)
        try:
            validate_request(prompts, params, self.cfg, vocab_size=self.vocab_size, max_positions=self.max_positions,
                             kv_capacity=self.core.engine.kv_capacity_tokens())
        except RequestError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        if params.interruptible and not self.core.engine.supports_interrupt:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"engine {self.core.engine.name!r} cannot interrupt requests: partial rollout is unavailable",
            )
        if not self.core.alive():
            context.abort(grpc.StatusCode.UNAVAILABLE, f"generation core is down: {self.core.error!r}")
        call = self.core.submit(prompts, params)
        context.add_callback(lambda: self.core.cancel(call))
        delivered = 0
        while delivered < call.expected:
            try:
                item = call.out.get(timeout=0.5)
            except queue.Empty:
                if not context.is_active():
                    return
                continue
            if isinstance(item, CallClosed):
                context.abort(grpc.StatusCode.UNAVAILABLE, str(item))
            if isinstance(item, Exception):
                context.abort(grpc.StatusCode.INTERNAL, str(item))
            delivered += 1
            yield convert.sample_to_pb(item)

    def UpdateWeights(self, request_iterator, context: grpc.ServicerContext) -> pb.UpdateAck:
        specs = self.core.engine.param_specs()
        assembler = WeightAssembler(specs, self.core.newest_version())
        try:
            for chunk in request_iterator:
                assembler.add(convert.chunk_from_pb(chunk))
            version, state = assembler.finish()
            self.core.stage_weights(version, state)
        except WeightError as err:
            context.abort(_WEIGHT_CODES[err.kind], str(_explained(err, specs)))
        except ValueError as err:  # lost a race with a newer version
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        log.info("%sstaged weight version %d (%d bytes)", self.core.label, version, assembler.bytes)
        return pb.UpdateAck(version=version, staged=True, bytes=assembler.bytes, tensors=len(state))

    def PullWeights(self, request: pb.PullWeightsRequest, context: grpc.ServicerContext) -> pb.UpdateAck:
        """Pull a version from the local relay (shared memory on the same host) and stage it."""
        if self.relay is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          "this SGS instance has no weight relay (start it with --relay)")
        if (why := pull_problem(request)) is not None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, why)
        from services.weights.client import RelayError

        try:
            return self.pull_and_stage(request.version, min(request.wait_s or self.pull_wait_s, self.pull_wait_s))
        except WeightError as err:
            context.abort(_WEIGHT_CODES.get(err.kind, grpc.StatusCode.FAILED_PRECONDITION),
                          str(_explained(err, self.core.engine.param_specs())))
        except RelayError as err:
            context.abort(err.code, f"relay {self.relay.address}: {err}")

    def pull_and_stage(self, version: int, wait_s: float) -> pb.UpdateAck:
        """Take ``version`` (-1 = latest) from the relay unless it is not newer than what this
        instance has; raises ``WeightError`` / ``RelayError``."""
        with self._pull_lock:  # one pull at a time; a second asks for what the first may already have staged
            newest = self.core.newest_version()
            if 0 <= version <= newest:
                return pb.UpdateAck(version=newest, staged=False)
            pulled = self._pull_at_least(version, wait_s)
            if pulled.version <= self.core.newest_version():
                return pb.UpdateAck(version=self.core.newest_version(), staged=False)
            try:
                self.core.stage_weights(pulled.version, pulled.state)
            except ValueError as err:  # lost a race with a newer UpdateWeights
                raise WeightError("precondition", str(err)) from None
            self._keep(pulled)
        log.info("%spulled and staged weight version %d from relay %s (%s%s%s)", self.core.label, pulled.version,
                 self.relay.address, pulled.path, ", into a pre-faulted buffer" if pulled.prefaulted else "",
                 f"; whole: {pulled.fallback}" if pulled.fallback else "")
        if pulled.path == "tcp":  # over the network: fault in the next version's buffer now, off the next pull's path
            threading.Thread(target=self._reserve_next, args=(pulled.manifest.total_bytes,), name="sgs-reserve",
                             daemon=True).start()
        return pb.UpdateAck(version=pulled.version, staged=True, bytes=pulled.manifest.total_bytes,
                            tensors=len(pulled.state), path=pulled.path, delta_fallback=bool(pulled.fallback),
                            fallback_reason=pulled.fallback)

    def _keep(self, pulled) -> None:
        """With deltas on, hold ``pulled`` as the next delta's base (how it came goes back in the
        ``UpdateAck``: the trainer counts it)."""
        if not self.delta:
            return
        from services.weights.delta_blob import Held

        view = memoryview(pulled.blob)[: pulled.manifest.total_bytes]
        self._held = Held(pulled.version, pulled.manifest, view, pulled.digest, data=pulled.blob)

    def _reserve_next(self, nbytes: int) -> None:
        with self._pull_lock:  # never while a pull receives; a pull waiting here gets the buffer
            self.relay.reserve(nbytes)
        log.info("%spre-faulted a %d-byte receive buffer for the next pull", self.core.label, nbytes)

    def _pull_at_least(self, version: int, wait_s: float):
        """Pull ``version`` from the relay, or its newest when ``version`` was already evicted
        (a relay keeps the newest K; a caller asking for v wants v or newer: a trainer that
        pushed several versions while this instance was busy must not wedge it)."""
        from services.weights.client import RelayError

        specs = self.core.engine.param_specs()
        have = self._held if self.delta and self._held is not None and self._held.manifest.specs() == specs else None
        try:
            pulled = self.relay.pull(version, streams=self.relay_streams, wait_s=wait_s, specs=specs, have=have)
        except RelayError as err:
            if version < 0 or err.code != grpc.StatusCode.NOT_FOUND:
                raise
            pulled = self.relay.pull(-1, streams=self.relay_streams, wait_s=0.0, specs=specs, have=have)
            if pulled.version < version:
                raise err from None
            log.info("%sversion %d is no longer held by relay %s: took its newest, %d", self.core.label, version,
                     self.relay.address, pulled.version)
        if self.delta and have is None and pulled.path != "shm":  # a new or restarted instance: no base yet
            pulled.fallback = "this instance held no version yet (new or restarted): the version came whole"
        return pulled

    def start_auto_pull(self, period_s: float) -> None:
        """Between requests: every ``period_s``, an idle instance (nothing running or waiting)
        takes its relay's newest version if it is newer than its own."""
        threading.Thread(target=self._auto_pull, args=(period_s,), name="sgs-auto-pull", daemon=True).start()

    def _auto_pull(self, period_s: float) -> None:
        import time

        from services.weights.client import RelayError

        while self.core.alive():
            time.sleep(period_s)
            h = self.core.health()
            if h.running or h.waiting:
                continue
            try:
                if self.relay.versions(timeout_s=5).latest > self.core.newest_version():
                    self.pull_and_stage(-1, 0.0)
            except WeightError as err:  # e.g. a version of other tensors than this instance serves
                log.warning("%sauto-pull from relay %s failed: %s", self.core.label, self.relay.address,
                            _explained(err, self.core.engine.param_specs()))
            except (RelayError, grpc.RpcError) as err:  # the relay may be restarting: retry next period
                log.warning("%sauto-pull from relay %s failed: %s", self.core.label, self.relay.address, err)

    def Health(self, request: pb.HealthRequest, context: grpc.ServicerContext) -> pb.HealthReply:
        return convert.health_to_pb(self.core.health())

    def Interrupt(self, request: pb.InterruptRequest, context: grpc.ServicerContext) -> pb.InterruptReply:
        """Return the samples of the tagged calls now, finish_reason "interrupted" (migration)."""
        tags = set(request.request_tags)
        if not tags or len(tags) > MAX_INTERRUPT_TAGS or any(not t or len(t) > MAX_TAG_CHARS for t in tags):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"request_tags must hold 1..{MAX_INTERRUPT_TAGS} non-empty tags of <= {MAX_TAG_CHARS} "
                          f"characters, got {len(request.request_tags)}")
        if not self.core.engine.supports_interrupt:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"engine {self.core.engine.name!r} cannot interrupt requests: migration is unavailable")
        if not self.core.alive():
            context.abort(grpc.StatusCode.UNAVAILABLE, f"generation core is down: {self.core.error!r}")
        try:
            return pb.InterruptReply(interrupted=self.core.interrupt(tags))
        except queue.Empty:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the generation core did not answer the interrupt in time")


def create_server(
    servicer: pb_grpc.GenerationServicer, address: str, *, max_message_mb: int, workers: int = 16,
    tls: TlsFiles | None = None, executor: futures.ThreadPoolExecutor | None = None,
) -> tuple[grpc.Server, int]:
    """Build a server bound to ``address`` (port 0 picks a free port); returns (server, port).
    With ``tls`` the port serves mutual TLS only: a client needs a certificate from the same CA.
    ``executor``: run its calls on this pool (shared by the instances of one process) instead of
    a pool of ``workers`` threads of its own."""
    server = new_server(workers=workers, thread_name_prefix="sgs-rpc", max_message_bytes=max_message_mb * MB,
                        executor=executor)
    pb_grpc.add_GenerationServicer_to_server(servicer, server)
    return server, bind(server, address, tls)
