"""Engine ``hf``: a dependency-light fallback on transformers' public model API.

Static batching: when no batch is running, up to ``max_inflight`` waiting requests (as many as
the KV budget ``num_blocks x page_size`` tokens holds) form a batch; their prompts are left-padded,
prefilled in one forward pass, then decoded one token per step with a ``DynamicCache``. A request
leaves the batch (its output is handed out) the step it ends; requests that arrive meanwhile wait
for the next batch. That is slower than vLLM's continuous batching on long-tailed lengths, which
is why ``vllm`` is the default: this engine exists for machines without vLLM and for tests whose
subject is not the engine (it starts in about a second).

Sampling per request (temperature, top-k, top-p) from one seeded generator (``generation.seed``),
so a run is reproducible; log-probs are of the distribution sampled from. A request with its own
``Sampling.seed`` draws its tokens from a generator of its own (``torch.Generator`` seeded with it,
one draw per step), so its sample does not depend on what else is in the batch or ran before; the
shared generator still draws for every row, so unseeded requests sample exactly as without it.
Interrupt returns each request's tokens and log-probs so far. Weights load with ``load_state_dict``
between batches.

With an adapter (``trainer.lora``) the model is wrapped with peft (``lora.wrap``: fresh adapters,
``lora_B`` zero, so it computes what the base does) and each weight version is an adapter: its
tensors are copied into the wrapped model's adapter (``set_peft_model_state_dict``), the base stays.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from services.common.config import GenerationConfig
from services.common.lora import LoraConfig, adapter_specs, wrap
from services.common.weights import TensorSpec, specs_of
from services.generation.checkpoint import inspect_checkpoint
from services.generation.engine import Engine, EngineOutput, Sampling, check_fits


@dataclass
class _Req:
    request_id: str
    prompt: list[int]
    max_new: int
    ignore_eos: bool
    sampling: Sampling
    gen: torch.Generator | None = None  # the request's own generator (``Sampling.seed``); None: the engine's
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    done: bool = False


class HFEngine(Engine):
    name = "hf"
    supports_interrupt = True

    def __init__(self, model_path: str, cfg: GenerationConfig, step_delay_s: float = 0.0,
                 adapter: LoraConfig | None = None) -> None:
        info = inspect_checkpoint(model_path)
        torch.set_num_threads(cfg.threads)
        self._model = AutoModelForCausalLM.from_pretrained(model_path, local_files_only=True, dtype=torch.float32)
        self._adapter_specs: dict[str, TensorSpec] | None = None
        if adapter is not None:
            self._model = wrap(self._model, adapter)
            self._adapter_specs = adapter_specs(model_path, adapter)
        self._model.eval()
        self.vocab_size, self.max_positions = info.vocab_size, info.max_positions
        self._eos = set(info.eos_ids)
        self._pad = info.eos_ids[0]
        self._cfg, self._step_delay_s = cfg, step_delay_s
        self._capacity_tokens = cfg.num_blocks * cfg.page_size
        self._gen = torch.Generator().manual_seed(cfg.seed)
        self._waiting: deque[_Req] = deque()
        self._batch: list[_Req] = []
        self._cache: DynamicCache | None = None
        self._mask = torch.zeros(0, 0, dtype=torch.long)
        self._next = torch.zeros(0, 1, dtype=torch.long)

    def submit(self, request_id: str, prompt: list[int], max_new_tokens: int, *, ignore_eos: bool = False,
               sampling: Sampling | None = None) -> None:
        check_fits(request_id, len(prompt), max_new_tokens, self._capacity_tokens)
        sampling = sampling or Sampling()
        sampling.check(self.vocab_size)
        gen = None if sampling.seed is None else torch.Generator().manual_seed(sampling.seed)
        self._waiting.append(_Req(request_id, list(prompt), max_new_tokens, ignore_eos, sampling, gen))

    def poll(self, timeout: float) -> list[EngineOutput]:
        deadline = time.monotonic() + timeout
        finished: list[EngineOutput] = []
        while not finished:
            if not any(not r.done for r in self._batch) and not self._start_batch():
                time.sleep(max(0.0, deadline - time.monotonic()))
                break
            if self._step_delay_s > 0:
                time.sleep(self._step_delay_s)
            finished += self._step()
            if time.monotonic() >= deadline:
                break
        return finished

    def _start_batch(self) -> bool:
        self._batch, self._cache = [], None
        budget = self._capacity_tokens
        while self._waiting and len(self._batch) < self._cfg.max_inflight:
            need = len(self._waiting[0].prompt) + self._waiting[0].max_new
            if need > budget:
                break
            budget -= need
            self._batch.append(self._waiting.popleft())
        if not self._batch:
            return False
        width = max(len(r.prompt) for r in self._batch)
        ids = torch.full((len(self._batch), width), self._pad, dtype=torch.long)
        self._mask = torch.zeros_like(ids)
        for row, r in enumerate(self._batch):
            ids[row, width - len(r.prompt):] = torch.tensor(r.prompt)
            self._mask[row, width - len(r.prompt):] = 1
        self._next = ids
        self._cache = DynamicCache()
        return True

    @torch.no_grad()
    def _step(self) -> list[EngineOutput]:
        positions = (self._mask.cumsum(-1) - 1).clamp(min=0)[:, -self._next.shape[1]:]
        out = self._model(input_ids=self._next, attention_mask=self._mask, position_ids=positions,
                          past_key_values=self._cache, use_cache=True)
        tokens, logprobs = self._sample(out.logits[:, -1, :].float())
        finished = []
        for row, r in enumerate(self._batch):
            if r.done:
                continue
            r.tokens.append(int(tokens[row]))
            r.logprobs.append(float(logprobs[row]))
            stop = not r.ignore_eos and r.tokens[-1] in self._eos
            if stop or len(r.tokens) >= r.max_new:
                r.done = True
                finished.append(EngineOutput(r.request_id, r.tokens, r.logprobs, "stop" if stop else "length"))
        self._next = tokens.view(-1, 1)
        self._mask = torch.cat([self._mask, torch.ones(len(self._batch), 1, dtype=torch.long)], dim=1)
        return finished

    def _sample(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        temps = torch.tensor([r.sampling.temperature_or(self._cfg.temperature) for r in self._batch])
        greedy = temps == 0  # argmax; its log-prob from the unscaled distribution, as vLLM reports it
        x = logits / torch.where(greedy, 1.0, temps).view(-1, 1)
        for row, r in enumerate(self._batch):  # top-k / top-p only where a request asked for them
            s = r.sampling
            if s.top_k:
                kth = torch.topk(x[row], min(s.top_k, x.shape[1])).values[-1]
                x[row] = x[row].masked_fill(x[row] < kth, float("-inf"))
            if s.top_p and s.top_p < 1.0:
                sorted_x, order = torch.sort(x[row], descending=True)
                probs = torch.softmax(sorted_x, -1)
                cut = probs.cumsum(-1) - probs >= s.top_p
                x[row] = x[row].scatter(0, order, sorted_x.masked_fill(cut, float("-inf")))
        logp = torch.log_softmax(x, -1)
        probs = logp.exp()
        tokens = torch.multinomial(probs, 1, generator=self._gen).view(-1)
        for row, r in enumerate(self._batch):  # seeded requests: their own generator's draw instead
            if r.gen is not None and not r.done:
                tokens[row] = torch.multinomial(probs[row], 1, generator=r.gen)[0]
        tokens = torch.where(greedy, logp.argmax(-1), tokens)
        return tokens, logp.gather(1, tokens.view(-1, 1)).view(-1)

    def _drop(self, request_id: str) -> _Req | None:
        for r in self._batch:
            if r.request_id == request_id and not r.done:
                r.done = True
                return r
        for r in self._waiting:
            if r.request_id == request_id:
                self._waiting.remove(r)
                return r
        return None

    def cancel(self, request_id: str) -> None:
        self._drop(request_id)

    def interrupt(self, request_ids: list[str]) -> dict[str, EngineOutput]:
        outputs = {}
        for rid in request_ids:
            r = self._drop(rid)
            tokens, logprobs = (r.tokens, r.logprobs) if r is not None else ([], [])
            outputs[rid] = EngineOutput(rid, list(tokens), list(logprobs), "interrupted")
        return outputs

    def param_specs(self) -> dict[str, TensorSpec]:
        if self._adapter_specs is not None:
            return self._adapter_specs
        return specs_of(self._model.state_dict())

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        if self._adapter_specs is None:
            self._model.load_state_dict(state, strict=True)
            return
        from peft import set_peft_model_state_dict

        if set(state) != set(self._adapter_specs):
            raise ValueError(f"adapter tensors {sorted(set(state) ^ set(self._adapter_specs))[:4]} are not this "
                             "engine's adapter (lora.adapter_specs)")
        result = set_peft_model_state_dict(self._model, state)
        if result.unexpected_keys:
            raise RuntimeError(f"peft did not place adapter tensors {result.unexpected_keys[:4]}")

    def kv_usage(self) -> float:
        live = [r for r in self._batch if not r.done]
        if not live:
            return 0.0
        return min(1.0, len(live) * self._mask.shape[1] / self._capacity_tokens)

    def kv_capacity_tokens(self) -> int:
        return self._capacity_tokens

    def close(self) -> None:
        self._waiting.clear()
        self._batch = []
