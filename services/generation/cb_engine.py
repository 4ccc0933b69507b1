"""Engine ``cb``: transformers' continuous batching (paged KV cache), CPU or GPU.

Sizing is explicit (``num_blocks`` x ``page_size`` tokens of KV cache, ``max_batch_tokens`` per
step): the library default sizes the cache to most of free memory. Prefix block sharing is
disabled: shared prefix blocks would keep KV computed with old weights after a swap and give
wrong outputs. Log-probs come from the sampling distribution (after temperature).

Interrupt (partial rollout) pauses the generation loop, reads each request's tokens and
log-probs so far from the scheduler's request state, and cancels the requests; the KV cache
they held is freed, so resuming means re-prefilling prompt + partial output with new weights.
``step_delay_s`` sleeps before every forward pass (straggler emulation in tests).

Attention (``generation.attention``): ``varlen`` (default) runs each sequence against its own
cached tokens (``services.generation.varlen_attention``), 2.3x the tokens/s of ``dense``
(transformers' masked SDPA over the whole batch) at 128 running sequences on this CPU.

Forced-length replay (``submit(..., ignore_eos=True)``): the request's stop test is disabled
(``eos_token_id=-1`` for that request only), so it generates exactly ``max_new_tokens`` tokens
whatever it samples; its finish reason is "length". This replays a recorded length
distribution on the tiny model (StreamRL §7's evaluation method).
"""

from __future__ import annotations

import time

import torch
from transformers import AutoModelForCausalLM
from transformers import GenerationConfig as HFGenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig

from services.common.config import GenerationConfig
from services.common.weights import TensorSpec, specs_of
from services.generation.engine import Engine, EngineOutput, register_engine
from services.generation.varlen_attention import install as install_varlen


class ContinuousBatchingEngine(Engine):
    name = "cb"

    supports_interrupt = True

    def __init__(self, model_path: str, cfg: GenerationConfig, step_delay_s: float = 0.0) -> None:
        torch.set_num_threads(cfg.threads)
        install_varlen(varlen=cfg.attention == "varlen")  # transformers' "sdpa" entry is process-wide
        self._model = AutoModelForCausalLM.from_pretrained(model_path, local_files_only=True, dtype=torch.float32)
        self._model.eval()
        if step_delay_s > 0:
            self._model.register_forward_pre_hook(lambda *_: time.sleep(step_delay_s))
        self.vocab_size = int(self._model.config.vocab_size)
        self.max_positions = int(self._model.config.max_position_embeddings)
        eos = self._model.config.eos_token_id
        if eos is None:
            raise ValueError(f"{model_path}: model config has no eos_token_id")
        self.eos_id = int(eos if isinstance(eos, int) else eos[0])
        gen = HFGenerationConfig(
            do_sample=True,
            temperature=cfg.temperature,
            top_k=None,
            top_p=None,
            max_new_tokens=cfg.max_new_tokens,
            eos_token_id=self.eos_id,
            pad_token_id=self._model.config.pad_token_id or self.eos_id,
        )
        cb = ContinuousBatchingConfig(
            num_blocks=cfg.num_blocks,
            page_size=cfg.page_size,
            max_batch_tokens=cfg.max_batch_tokens,
            allow_block_sharing=False,
            return_logprobs=True,
            seed=cfg.seed,
        )
        self._manager = self._model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
        self._manager.start()
        self._forced: set[str] = set()  # request ids submitted with ignore_eos
        self._capacity_tokens = cfg.num_blocks * cfg.page_size

    def submit(self, request_id: str, prompt: list[int], max_new_tokens: int, *, ignore_eos: bool = False) -> None:
        # eos_token_id=-1 disables the stop test for this request only (forced-length replay)
        eos = -1 if ignore_eos else None
        rid = self._manager.add_request(prompt, request_id=request_id, max_new_tokens=max_new_tokens, eos_token_id=eos)
        if ignore_eos:
            self._forced.add(request_id)
        if rid is None:
            raise RuntimeError("continuous batching manager refused the request (stopped or failed)")

    def poll(self, timeout: float) -> list[EngineOutput]:
        outputs: list[EngineOutput] = []
        result = self._manager.get_result(timeout=timeout)
        while result is not None:
            outputs.append(self._convert(result))
            result = self._manager.get_result(timeout=0)
        if not outputs and not self._manager.is_running():
            raise RuntimeError("continuous batching loop stopped unexpectedly")
        return outputs

    def _convert(self, result) -> EngineOutput:  # result: transformers GenerationOutput
        tokens = [int(t) for t in result.generated_tokens]
        forced = result.request_id in self._forced
        self._forced.discard(result.request_id)
        reason = "stop" if tokens and tokens[-1] == self.eos_id and not forced else "length"
        return EngineOutput(
            request_id=result.request_id,
            token_ids=tokens,
            logprobs=[float(x) for x in result.logprobs],
            finish_reason=reason,
            error=result.error,
        )

    def cancel(self, request_id: str) -> None:
        self._forced.discard(request_id)
        self._manager.cancel_request(request_id)

    def interrupt(self, request_ids: list[str]) -> dict[str, EngineOutput]:
        outputs: dict[str, EngineOutput] = {}
        with self._manager.pause():
            scheduler = self._manager.batch_processor.scheduler
            for rid in request_ids:
                state = scheduler.active_requests.get(rid) or scheduler.waiting_requests.get(rid)
                tokens: list[int] = []
                logprobs: list[float] = []
                if state is not None:
                    out = state.to_generation_output()
                    n = min(len(out.generated_tokens), len(out.logprobs))  # a token without its log-prob is redone
                    tokens = [int(t) for t in out.generated_tokens[:n]]
                    logprobs = [float(x) for x in out.logprobs[:n]]
                outputs[rid] = EngineOutput(rid, tokens, logprobs, "interrupted")
                self._forced.discard(rid)
                self._manager.cancel_request(rid)
        return outputs

    def param_specs(self) -> dict[str, TensorSpec]:
        return specs_of(self._model.state_dict())

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        with self._manager.pause():
            self._model.load_state_dict(state, strict=True)

    def kv_usage(self) -> float:
        processor = self._manager.batch_processor
        if processor is None:
            return 0.0
        return float(1.0 - processor.cache.compute_free_capacity(relative=True))

    def kv_capacity_tokens(self) -> int:
        return self._capacity_tokens

    def close(self) -> None:
        self._manager.stop(block=True)


@register_engine("cb")
def _make(model_path: str, cfg: GenerationConfig, step_delay_s: float = 0.0) -> Engine:
    return ContinuousBatchingEngine(model_path, cfg, step_delay_s)
