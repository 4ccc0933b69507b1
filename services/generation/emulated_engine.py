"""Engine ``emulated``: continuous batching as vLLM schedules it, with no model compute (EMULATED).

Everything an engine does except the accelerator's work: requests are admitted, batched,
preempted, interrupted, cancelled and handed out in completion order as vLLM's scheduler does,
and each step takes the time a latency profile predicts, waited out on the monotonic clock
without using the CPU. Its times are predictions, never measurements; its tokens are SYNTHETIC
(``synthetic = True``): emulation measures time, never learning. Configured by
``generation.emulation`` (``services.common.emulation_config``), which it refuses to start without.

- **The model** is ``scheduling.instance_model.SteppedInstance``, the continuous-batching model
  the allocator's simulators run, so the live emulation and the simulators are one policy: FIFO
  admission (the SGS core already ordered what it submits) while fewer than ``max_inflight`` run
  and the KV cache (``num_blocks x page_size`` tokens, counted in tokens, less the profile's
  watermark) holds them; one token per running sequence per step; when the running sequences
  outgrow the cache the newest is preempted (recompute: back to the head of the queue with its
  progress, paying prefill again). Step cost: the profile's ``StepCost``
  (``scheduling.profiles.load_profile``: a shipped name or a path) plus ``step_delay_s`` per step
  (a straggler's slower step, a modelled duration like the rest, so scaled too).
- **Time**: the model's work clock maps onto the monotonic clock as ``anchor + work x time_scale``
  (re-anchored when an idle engine gets work). The engine runs in wall time like an engine core of
  its own, whether or not it is polled; no thread runs it: every call first brings the model up to
  now (``_sync``), jumping segment to segment (a segment ends at the next completion or KV
  overflow). A request submitted mid-segment joins at the next step boundary (the segment is cut
  after the step in progress); a cancel or interrupt takes effect at the last finished step and
  returns the tokens of the steps finished by then. ``poll`` waits on an event until an output is
  ready or its timeout passes, and at least until the step in progress ends (an in-process
  engine's poll runs a step), unless ``wake`` (the SGS core has new work) or ``close`` ends it.
  Its core polls with a long timeout (``poll_wait_s``) and so wakes only when an output is due or
  work arrives: hundreds of idle or busy instances in one process cost little CPU.
- **Lengths** (``services.generation.emulation.LengthSampler``): drawn at submit; ``ignore_eos``
  forces ``max_new_tokens``; a longer draw is cut to ``max_new_tokens`` (finish ``length``), a
  shorter one ends with EOS (``stop``). A seeded request (``Sampling.seed``) draws its length and
  tokens from a generator of its own seed and prompt; an unseeded one from a generator seeded by a
  draw of the engine's (``generation.seed``), which every unseeded request advances. An
  **interrupted** request (partial rollout, migration) keeps its length across the interrupt: the
  tokens it returns (prompt + output so far) key what it had left in a process-wide table
  (``REMAINING``), and a request submitted with exactly those tokens as its prompt (its resume, on
  any instance of the process) generates that remainder rather than a fresh draw, so interrupting
  never reshapes the trace's tail. A resume in another process (only with more instances than one
  process hosts, ``--instances``) cannot be told from a new request and draws afresh.
- **Weights**: ``param_specs`` from the checkpoint's config on the meta device (no weights read;
  an adapter's tensors with ``adapter``); ``load_weights`` checks names, shapes and dtypes exactly
  and takes the modelled reload time (``emulation.reload_s``, default the profile's ``k2``).
- Requests are refused as by the other engines (``ValueError``): larger than the KV cache, longer
  than the model's positions, ids outside the vocabulary, sampling out of range.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from services.common.config import GenerationConfig
from services.common.emulation_config import EmulationConfig
from services.common.lora import LoraConfig
from services.common.weights import TensorSpec, dtype_name
from services.generation.checkpoint import CheckpointInfo, inspect_checkpoint, tensor_specs
from services.generation.emulation import LengthSampler, load_lengths, request_rng, synthetic_tokens
from services.generation.engine import Engine, EngineOutput, Sampling, check_fits
from services.generation.scheduling.cost import InstanceSpec
from services.generation.scheduling.instance_model import Job, SteppedInstance
from services.generation.scheduling.profiles import (
    Profile,
    ProfileError,
    derive_profile,
    load_profile,
    shipped_profile,
)


@dataclass
class _Req:
    request_id: str
    length: int  # tokens it will generate
    stop: bool  # ends at EOS (else at max_new_tokens: "length")
    rng: random.Random
    prompt: tuple[int, ...] = ()


class Remaining:
    """What interrupted requests had left to generate, by the tokens they returned (one table per
    process, ``REMAINING``: a resume may land on any instance of the process). Bounded: the oldest
    entries go first."""

    LIMIT = 65536

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._left: dict[bytes, tuple[int, bool]] = {}

    @staticmethod
    def key(tokens: list[int] | tuple[int, ...]) -> bytes:
        return hashlib.blake2b(",".join(map(str, tokens)).encode(), digest_size=16).digest()

    def put(self, tokens: list[int], left: int, stop: bool) -> None:
        with self._lock:
            self._left[self.key(tokens)] = (max(1, left), stop)
            while len(self._left) > self.LIMIT:
                self._left.pop(next(iter(self._left)))

    def take(self, prompt: list[int]) -> tuple[int, bool] | None:
        with self._lock:
            return self._left.pop(self.key(prompt), None)


REMAINING = Remaining()


def resolve_profile(name: str) -> Profile:
    """A profile by shipped name (``allocator/profiles/<name>.json``), path, or ``KIND:MODEL[:tpN]``
    (derived from the kind's spec sheet at tensor parallelism N: ``H20:qwen2.5-7b:tp4``);
    ``ProfileError`` names what is wrong."""
    is_path = name.endswith(".json") or "/" in name
    if not is_path and ":" in name:
        return derived_profile(name)
    return load_profile(Path(name) if is_path else shipped_profile(name))


def derived_profile(name: str) -> Profile:
    """``KIND:MODEL[:tpN]`` as a roofline-derived profile (``scheduling.profiles.derive_profile``)."""
    parts = name.split(":")
    tp = None
    if len(parts) == 3 and parts[2].startswith("tp") and parts[2][2:].isdigit() and int(parts[2][2:]) >= 1:
        tp = int(parts[2][2:])
    elif len(parts) != 2:
        raise ProfileError(f"profile {name!r}: a derived profile is KIND:MODEL or KIND:MODEL:tpN "
                           "(e.g. H20:qwen2.5-7b:tp4)")
    try:
        return derive_profile(parts[0], parts[1], tp)
    except ValueError as err:
        raise ProfileError(f"profile {name!r}: {err}") from None


class EmulatedEngine(Engine):
    name = "emulated"
    supports_interrupt = True
    synthetic = True  # token ids and log-probs are made up: never train on them
    poll_wait_s = 1.0  # poll returns when an output is due or wake() is called; this only bounds a wait

    def __init__(self, model_path: str, cfg: GenerationConfig, step_delay_s: float = 0.0,
                 adapter: LoraConfig | None = None) -> None:
        emu = cfg.emulation
        if emu is None:
            raise ValueError("generation.engine 'emulated' needs generation.emulation (profile, lengths, time_scale): "
                             "it replays a latency profile and output lengths instead of running a model")
        info, self.profile, self._lengths = _assets(model_path, emu)
        self.vocab_size, self.max_positions, self._eos = info.vocab_size, info.max_positions, info.eos_ids
        cost = self.profile.step_cost_model()
        cost = replace(cost, k4=cost.k4 + step_delay_s)  # a straggler: each step that much slower
        self._capacity_tokens = cfg.num_blocks * cfg.page_size
        self.spec = InstanceSpec(cost, self._capacity_tokens, cfg.max_inflight, self.profile.watermark)
        self.time_scale = emu.time_scale
        self._reload_s = self.profile.step_cost.k2 if emu.reload_s is None else emu.reload_s
        self._specs = _specs(model_path, adapter)
        self._gen = random.Random(cfg.seed)
        self._clock = time.monotonic  # waits are real: Event.wait on the same monotonic clock
        self._lock = threading.RLock()  # kv_usage is read from RPC threads; the rest from the core thread
        self._closed = threading.Event()  # set by close(): ends any wait
        self._woken = threading.Event()  # set by wake() (and close()): ends a poll's wait
        self._reset()

    def _reset(self) -> None:
        self._inst = SteppedInstance(self.spec, "fcfs")
        self._reqs: dict[str, _Req] = {}
        self._ready: deque[tuple[float, EngineOutput]] = deque()  # (wall time it is out, output), in time order
        self._anchor = (self._clock(), 0.0)  # (wall, work) of one instant: wall = w0 + (work - t0) x time_scale
        self._busy = False  # the model has an open segment

    # ------------------------------------------------------------------ clock
    def _wall(self, work_s: float) -> float:
        w0, t0 = self._anchor
        return w0 + (work_s - t0) * self.time_scale

    def _work(self, wall_s: float) -> float:
        w0, t0 = self._anchor
        return t0 + (wall_s - w0) / self.time_scale

    def _open(self) -> None:
        self._busy = self._inst.open() is not None

    def _sync(self, now: float) -> None:
        """Run every segment that ends by ``now``; the outputs of each are out at its end."""
        while self._busy:
            seg = self._inst.open()
            assert seg is not None
            end = self._wall(seg.end_s)
            if end > now:
                return
            self._finish(self._inst.close(), end)
            self._open()

    def _cut(self, now: float, round_up: bool) -> None:
        """Bring the model to ``now`` and close the open segment at a step boundary: after the step
        in progress (``round_up``: an arrival joins the next step) or at the last finished one."""
        self._sync(now)
        if self._busy:
            k = self._inst.steps_done(self._work(now), round_up)
            self._finish(self._inst.close(k), self._wall(self._inst.work_s))
            self._busy = False

    def _finish(self, done: list[str], at: float) -> None:
        for rid in done:
            r = self._reqs.pop(rid)
            tokens, logprobs = synthetic_tokens(r.rng, r.length, self.vocab_size, self._eos, r.stop)
            self._ready.append((at, EngineOutput(rid, tokens, logprobs, "stop" if r.stop else "length")))

    # ------------------------------------------------------------------ Engine
    def submit(self, request_id: str, prompt: list[int], max_new_tokens: int, *, ignore_eos: bool = False,
               sampling: Sampling | None = None) -> None:
        self._check(request_id, prompt, max_new_tokens)
        sampling = sampling or Sampling()
        sampling.check(self.vocab_size)
        with self._lock:
            if request_id in self._reqs:
                raise ValueError(f"request {request_id} is already running")
            seed = sampling.seed if sampling.seed is not None else self._gen.getrandbits(64)
            rng = request_rng(seed, prompt)
            left = None if ignore_eos else REMAINING.take(prompt)
            if left is not None:  # a resume: what it had left when interrupted
                drawn, stop = left[0], left[1] and left[0] <= max_new_tokens
            else:
                drawn = max_new_tokens if ignore_eos else self._lengths.draw(rng)
                stop = drawn < max_new_tokens
            self._reqs[request_id] = _Req(request_id, min(drawn, max_new_tokens), stop, rng, tuple(prompt))
            now = self._clock()
            self._cut(now, round_up=True)
            if self._inst.running == 0 and self._inst.queued == 0:  # idle: the work clock restarts now
                self._anchor = (max(now, self._wall(self._inst.work_s)), self._inst.work_s)
            self._inst.push([Job(request_id, len(prompt), self._reqs[request_id].length)])
            self._open()

    def _check(self, request_id: str, prompt: list[int], max_new_tokens: int) -> None:
        check_fits(request_id, len(prompt), max_new_tokens, self._capacity_tokens)
        if not prompt:
            raise ValueError(f"request {request_id} has an empty prompt")
        if max_new_tokens < 1:
            raise ValueError(f"request {request_id}: max_new_tokens must be >= 1, got {max_new_tokens}")
        if len(prompt) + max_new_tokens > self.max_positions:
            raise ValueError(f"request {request_id}: prompt {len(prompt)} + {max_new_tokens} new tokens exceed the "
                             f"model's {self.max_positions} positions")
        bad = next((t for t in prompt if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"request {request_id}: token id {bad} out of range [0, {self.vocab_size})")

    def poll(self, timeout: float) -> list[EngineOutput]:
        with self._lock:
            now = self._clock()
            until = now + max(0.0, timeout)
            self._sync(now)
            if self._busy and not (self._ready and self._ready[0][0] <= now):
                until = max(until, self._step_end(now))  # at least the step in progress, as an engine step takes
        while not self._closed.is_set():
            with self._lock:
                now = self._clock()
                self._sync(now)
                if (self._ready and self._ready[0][0] <= now) or now >= until:
                    return self._take(now)
                wake = until
                if self._ready:
                    wake = min(wake, self._ready[0][0])
                if self._busy:
                    seg = self._inst.open()
                    assert seg is not None
                    wake = min(wake, self._wall(seg.end_s))
            if self._woken.wait(max(0.0, wake - now)):
                # the caller has work: hand out what is due now. A wake() after this clear() is not
                # lost to the caller: it follows an inbox item the caller reads before it polls again.
                self._woken.clear()
                with self._lock:
                    now = self._clock()
                    self._sync(now)
                    return self._take(now)
        return []

    def wake(self) -> None:
        self._woken.set()

    def _step_end(self, now: float) -> float:
        """Wall time at which the decode step in progress at ``now`` ends (the open segment's)."""
        seg = self._inst.open()
        assert seg is not None
        k = self._inst.steps_done(self._work(now)) + 1
        return self._wall(seg.end_s if k >= seg.steps else seg.start_s + self._inst.step_time(k))

    def _take(self, now: float) -> list[EngineOutput]:
        out = []
        while self._ready and self._ready[0][0] <= now:
            out.append(self._ready.popleft()[1])
        return out

    def cancel(self, request_id: str) -> None:
        with self._lock:
            self._drop(request_id)

    def _drop(self, request_id: str, resumes: bool = False) -> EngineOutput | None:
        """Take a request out at the last finished step; its output so far (None if not held).
        ``resumes``: it will be resumed (an interrupt), so what it has left is remembered."""
        now = self._clock()
        self._sync(now)  # first: a request whose segment ended by now has finished, running no more
        r = self._reqs.pop(request_id, None)
        if r is None:  # finished: its output may still wait for its time to come
            done = next((o for _, o in self._ready if o.request_id == request_id), None)
            self._ready = deque(item for item in self._ready if item[1].request_id != request_id)
            return done
        self._cut(now, round_up=False)
        k = self._inst.remove(request_id) or 0
        self._open()
        tokens, logprobs = synthetic_tokens(r.rng, k, self.vocab_size, self._eos, False)
        if resumes and k < r.length:  # what it has left goes with the tokens it returns (its resume finds it)
            REMAINING.put([*r.prompt, *tokens], r.length - k, r.stop)
        return EngineOutput(request_id, tokens, logprobs, "interrupted")

    def interrupt(self, request_ids: list[str]) -> dict[str, EngineOutput]:
        outputs = {}
        with self._lock:
            for rid in request_ids:
                out = self._drop(rid, resumes=True)
                tokens, logprobs = (out.token_ids, out.logprobs) if out is not None else ([], [])
                outputs[rid] = EngineOutput(rid, tokens, logprobs, "interrupted")
        return outputs

    def param_specs(self) -> dict[str, TensorSpec]:
        return self._specs

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        if self._reqs:
            raise RuntimeError(f"load_weights with {len(self._reqs)} requests running (the SGS core drains first)")
        check_state(state, self._specs)
        self._closed.wait(self._reload_s * self.time_scale)

    def kv_usage(self) -> float:
        with self._lock:
            if not self._busy:
                return min(1.0, self._inst.kv_tokens / self._capacity_tokens)
            k = self._inst.steps_done(self._work(self._clock()))
            return min(1.0, (self._inst.kv_tokens + self._inst.running * k) / self._capacity_tokens)

    def kv_capacity_tokens(self) -> int:
        return self._capacity_tokens

    @property
    def preemptions(self) -> int:
        """Sequences preempted so far (the KV cache ran out; recomputed later)."""
        return self._inst.run.preemptions

    def close(self) -> None:
        self._closed.set()
        self._woken.set()
        with self._lock:
            self._reset()


def check_state(state: dict[str, torch.Tensor], specs: dict[str, TensorSpec]) -> None:
    """Refuse a weight update that is not exactly ``specs`` (``ValueError`` naming the difference)."""
    missing, unexpected = sorted(set(specs) - set(state)), sorted(set(state) - set(specs))
    if missing or unexpected:
        raise ValueError(f"weight update does not match the engine's tensors: missing {missing[:4]}, "
                         f"unexpected {unexpected[:4]}")
    for name, t in state.items():
        want = specs[name]
        if tuple(t.shape) != want.shape or dtype_name(t.dtype) != want.dtype:
            raise ValueError(f"weight update tensor {name}: {dtype_name(t.dtype)} {tuple(t.shape)}, the engine "
                             f"takes {want.dtype} {want.shape}")


# Many instances in one process (``--instances``) share one read of the checkpoint, profile and trace, and one table.
_ASSETS: dict[tuple[str, str], tuple[CheckpointInfo, Profile, LengthSampler]] = {}
_SPECS: dict[tuple[str, str], dict[str, TensorSpec]] = {}


def _assets(model_path: str, emu: EmulationConfig) -> tuple[CheckpointInfo, Profile, LengthSampler]:
    """The checkpoint's facts, the latency profile and the length sampler (all read-only once built)."""
    key = (str(Path(model_path).resolve()), emu.model_dump_json())
    if key not in _ASSETS:
        _ASSETS[key] = (inspect_checkpoint(model_path), resolve_profile(emu.profile), load_lengths(emu))
    return _ASSETS[key]



def _specs(model_path: str, adapter: LoraConfig | None) -> dict[str, TensorSpec]:
    """Float32 names and shapes of the checkpoint (or of the adapter on it), from its config on the
    meta device: no weights are read."""
    key = (str(Path(model_path).resolve()), adapter.model_dump_json() if adapter is not None else "")
    if key not in _SPECS:
        if adapter is None:
            _SPECS[key] = tensor_specs(model_path, torch.float32)
        else:
            from services.common.lora import adapter_specs

            _SPECS[key] = adapter_specs(model_path, adapter)
    return _SPECS[key]
