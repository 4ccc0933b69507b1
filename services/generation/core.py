"""The SGS core: one thread owns the engine and runs schedule -> execute -> update.

Every call into the engine happens on the core thread, so the engine needs no locking. Each
pass of the loop:

1. takes new sequences, cancellations and staged weights from the inbox;
2. installs a staged weight version once no request is in flight (in-flight requests finish
   on the version they started with; admission pauses while a version is staged, so the
   drain is bounded by the longest running request). If every running request is
   *interruptible* (partial rollout), they are interrupted instead: each comes back at once
   with its tokens so far and finish_reason "interrupted", and the version installs without
   a drain; the caller resumes them (prompt + partial output) on the new weights;
3. admits waiting sequences whose ``min_weight_version`` is installed, up to
   ``max_inflight``, in the configured order (``scheduling.admission.AdmissionQueue``: LPT =
   longest ``estimated_length`` first, Graham's rule as in StreamRL §5.3; or FCFS). The engine
   admits what it is given in that order as its KV cache allows; a forced-length sequence
   (``forced_length``) is submitted with EOS ignored;
4. polls the engine and routes each finished output to its call's queue at once, so the RPC
   layer streams it while the rest of the batch is still running.

Wake-ups: an idle core blocks on its inbox; a busy one in ``engine.poll`` for up to the engine's
``poll_wait_s`` (vLLM, hf: 5 ms, a step; emulated: until its next output is due). Every inbox
item (submit, cancel, weights, interrupt, stop) is followed by ``engine.wake()``, which ends that
poll early, so a long poll never delays new work and an idle or waiting core costs no CPU.

A call with a ``seed`` (``GenerateParams.seed``: evaluations) gives each of its samples a seed of
its own, derived from the call's seed and the sample's prompt id and index (``request_seed``); the
engine samples that request from its own generator, so the same seed, prompt and weights give the
same sample in every such call. Unseeded calls (training rollouts) draw from the engine's generator.

``interrupt(tags)`` (migration, the coordinator's Interrupt command) returns every running or
queued sample of the calls with those request tags at once, finish_reason "interrupted", with
its tokens so far (none for a queued one); the caller resumes them elsewhere.

A failure in the loop is recorded, every open call receives it, and ``error`` is set so the
process supervisor can exit non-zero.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from services.common.types import GenerateParams, HealthSnapshot, PromptSpec, SampleRecord
from services.generation.engine import Engine, EngineOutput, Sampling
from services.generation.scheduling.admission import AdmissionQueue

log = logging.getLogger("braid.sgs")

# An idle core waits on its inbox this long at most: every inbox item (stop() included) ends the wait
# at once, so this bounds only how long a lost wake-up could go unnoticed.
IDLE_WAIT_S = 1.0


def request_seed(seed: int, prompt_id: str, sample_index: int) -> int:
    """The seed of one sample of a seeded call: a stable hash (BLAKE2b, never Python's salted
    ``hash``) of the call's seed and the sample's identity, 63 bits (every engine's seed range).
    Each prompt of a call gets its own seed, and the same prompt and index the same seed in every
    call with the same seed, whichever instance serves it and whatever else it serves."""
    digest = hashlib.blake2b(f"{seed}\0{sample_index}\0{prompt_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def sampling_of(params: GenerateParams, prompt_id: str, sample_index: int) -> Sampling:
    """The engine sampling of one sample of a call: the call's settings, and its own seed when the call has one."""
    seed = None if params.seed is None else request_seed(params.seed, prompt_id, sample_index)
    return Sampling(params.temperature, params.top_p, params.top_k, seed)


class CallClosed(Exception):
    """Sentinel put on a call's queue when the core stops or fails."""


@dataclass
class Call:
    """One Generate request: its expected sample count and the queue samples arrive on."""

    call_id: int
    expected: int
    out: queue.Queue = field(default_factory=queue.Queue)
    cancelled: bool = False
    tag: str = ""


@dataclass
class _Seq:
    request_id: str
    call: Call
    prompt: PromptSpec
    sample_index: int
    max_new_tokens: int
    min_version: int
    submitted_at: float
    interruptible: bool = False
    sampling: Sampling | None = None
    started_at: float = 0.0
    version: int = -1

    @property
    def estimate(self) -> float | None:
        return self.prompt.estimated_length or None


class GenerationCore:
    def __init__(
        self, engine: Engine, *, max_inflight: int, default_max_new_tokens: int, version: int = 0,
        admission: str = "fcfs", on_finished: Callable[[SampleRecord], None] | None = None,
        instance: int | None = None,
    ) -> None:
        """``instance``: its index when the process serves several (``--instances``): it names the core's
        thread and prefixes its log lines."""
        self.engine = engine
        self.label = "" if instance is None else f"instance {instance}: "
        self.max_inflight = max_inflight
        self.default_max_new_tokens = default_max_new_tokens
        self.version = version
        self.pending_version = -1
        self.error: BaseException | None = None
        self.finished = 0
        self.generated_tokens = 0
        self._pending_state: dict[str, torch.Tensor] | None = None
        self._inbox: queue.Queue = queue.Queue()
        self._waiting: AdmissionQueue[_Seq] = AdmissionQueue(admission, lambda s: s.estimate)  # type: ignore[arg-type]
        self._on_finished = on_finished  # e.g. the generation log; called on the core thread
        self._running: dict[str, _Seq] = {}
        self._calls = itertools.count()
        self._stage_lock = threading.Lock()
        self._stop = threading.Event()
        name = "sgs-core" if instance is None else f"sgs-core-{instance}"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    # ------------------------------------------------------------------ API (any thread)
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.request_stop()
        self.join()

    def request_stop(self) -> None:
        """Tell the core thread to end (``join`` waits for it): many cores stop at once."""
        self._stop.set()
        self._post("stop", None)

    def join(self, timeout_s: float = 30.0) -> None:
        self._thread.join(timeout=timeout_s)

    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def submit(self, prompts: list[PromptSpec], params: GenerateParams) -> Call:
        call = Call(call_id=next(self._calls), expected=len(prompts) * params.samples_per_prompt, tag=params.tag)
        now = time.time()
        max_new = params.max_new_tokens or self.default_max_new_tokens
        seqs = [
            _Seq(f"c{call.call_id}-{p.prompt_id}-{i}", call, p, i, max_new, params.min_weight_version, now,
                 params.interruptible, sampling_of(params, p.prompt_id, i))
            for p in prompts
            for i in range(params.samples_per_prompt)
        ]
        self._post("seqs", seqs)
        return call

    def cancel(self, call: Call) -> None:
        call.cancelled = True
        self._post("cancel", call)

    def _post(self, kind: str, payload: object) -> None:
        """Put an item on the inbox and wake the core from a poll in progress."""
        self._inbox.put((kind, payload))
        self.engine.wake()

    def interrupt(self, tags: set[str], timeout_s: float = 30.0) -> int:
        """Interrupt every running or queued sample of the calls tagged ``tags`` (on the core
        thread, between engine steps); returns how many were interrupted."""
        if not self.engine.supports_interrupt:
            raise NotImplementedError(f"engine {self.engine.name!r} cannot interrupt requests")
        done: queue.Queue = queue.Queue()
        self._post("interrupt", (frozenset(tags), done))
        return done.get(timeout=timeout_s)

    def newest_version(self) -> int:
        with self._stage_lock:
            return max(self.version, self.pending_version)

    def stage_weights(self, version: int, state: dict[str, torch.Tensor]) -> None:
        """Stage a validated version; it replaces any older staged one."""
        with self._stage_lock:
            if version <= max(self.version, self.pending_version):
                raise ValueError(f"version {version} is not newer than {max(self.version, self.pending_version)}")
            self.pending_version = version
            self._post("weights", (version, state))

    def health(self) -> HealthSnapshot:
        return HealthSnapshot(
            status="draining" if self.pending_version >= 0 else "serving",
            weight_version=self.version,
            pending_version=self.pending_version,
            running=len(self._running),
            waiting=len(self._waiting),
            finished=self.finished,
            kv_usage=self.engine.kv_usage() if self.alive() else 0.0,
            engine=self.engine.name,
            generated_tokens=self.generated_tokens,
        )

    # ------------------------------------------------------------------ core thread
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._take_inbox(block=not self._running)
                self._maybe_install()
                self._admit()
                if self._running:
                    for out in self.engine.poll(timeout=self.engine.poll_wait_s):
                        self._deliver(out)
        except BaseException as exc:  # recorded and surfaced to every caller and the supervisor
            log.exception("%sSGS core failed", self.label)
            self.error = exc
        finally:
            self._close_all()

    def _take_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=IDLE_WAIT_S) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, payload = item
            if kind == "seqs":
                self._waiting.extend(payload)
            elif kind == "cancel":
                self._cancel(payload)
            elif kind == "weights":
                self._pending_state = payload[1]
            elif kind == "interrupt":
                self._interrupt(*payload)
            # "stop": only a wake-up; the loop sees _stop set
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _cancel(self, call: Call) -> None:
        self._waiting.remove_if(lambda s: s.call is call)
        for rid, seq in list(self._running.items()):
            if seq.call is call:
                self.engine.cancel(rid)
                del self._running[rid]

    def _interrupt(self, tags: frozenset[str], done: queue.Queue) -> None:
        queued = self._waiting.remove_if(lambda s: s.call.tag in tags and not s.call.cancelled)
        running = [rid for rid, seq in self._running.items() if seq.call.tag in tags and not seq.call.cancelled]
        if running:
            for out in self.engine.interrupt(running).values():
                self._deliver(out)
        for seq in queued:  # never admitted: nothing generated, no weight version
            self._emit(seq, EngineOutput(seq.request_id, [], [], "interrupted"))
        done.put(len(running) + len(queued))

    def _maybe_install(self) -> None:
        if self._pending_state is None:
            return
        if self._running:
            if not all(seq.interruptible for seq in self._running.values()):
                return  # drain: in-flight requests finish on their version
            for out in self.engine.interrupt(list(self._running)).values():
                self._deliver(out)
        with self._stage_lock:
            version, state = self.pending_version, self._pending_state
            self._pending_state = None
        self.engine.load_weights(state)
        with self._stage_lock:
            self.version = version
            if self.pending_version == version:
                self.pending_version = -1
        log.info("%sinstalled weight version %d", self.label, version)

    def _admit(self) -> None:
        if self._pending_state is not None:
            return
        room = self.max_inflight - len(self._running)
        if room <= 0 or not self._waiting:
            return
        for seq in self._waiting.pop(room, eligible=lambda s: s.min_version <= self.version):
            seq.started_at = time.time()
            seq.version = self.version
            forced = seq.prompt.forced_for(seq.sample_index)
            self._running[seq.request_id] = seq
            try:
                self.engine.submit(seq.request_id, list(seq.prompt.token_ids), forced or seq.max_new_tokens,
                                   ignore_eos=forced > 0, sampling=seq.sampling)
            except ValueError as err:  # a request this engine can never serve: that call fails, the core goes on
                self._deliver(EngineOutput(seq.request_id, [], [], "error", error=str(err)))

    def _deliver(self, out) -> None:
        seq = self._running.pop(out.request_id, None)
        if seq is None:  # cancelled meanwhile
            return
        if out.error:
            seq.call.out.put(RuntimeError(f"engine failed on {out.request_id}: {out.error}"))
            return
        self._emit(seq, out)

    def _emit(self, seq: _Seq, out: EngineOutput) -> None:
        """Put ``seq``'s output on its call's queue as a SampleRecord (and count it)."""
        if out.finish_reason != "interrupted":
            self.finished += 1
        self.generated_tokens += len(out.token_ids)
        record = SampleRecord(
            prompt_id=seq.prompt.prompt_id,
            group_id=seq.prompt.group,
            sample_index=seq.sample_index,
            prompt_token_ids=seq.prompt.token_ids,
            token_ids=tuple(out.token_ids),
            logprobs=tuple(out.logprobs),
            weight_version=seq.version,
            finish_reason=out.finish_reason,
            submitted_at=seq.submitted_at,
            started_at=seq.started_at,
            finished_at=time.time(),
        )
        seq.call.out.put(record)
        if self._on_finished is not None and out.finish_reason != "interrupted":
            self._on_finished(record)

    def _close_all(self) -> None:
        reason = CallClosed(f"generation core stopped: {self.error!r}" if self.error else "generation core stopped")
        calls = {s.call.call_id: s.call for s in list(self._waiting) + list(self._running.values())}
        for call in calls.values():
            call.out.put(reason)
