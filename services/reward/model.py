"""The model reward: a small learned classifier reading the transcript, returning P(correct).

The classifier is a Hugging Face ``*ForSequenceClassification`` checkpoint with two labels
(0: wrong, 1: correct) loaded from a local directory (never downloaded); the reward is
``softmax(logits)[1]``. ``braid reward train`` (``services.reward.train``) builds a tiny
``Qwen2ForSequenceClassification`` with the policy's character tokenizer
(``services.policy.model.char_tokenizer``) and trains it on calculator transcripts.

Rendering (fixed, version ``RENDERING``; training and scoring both call ``encode``): the
transcript as the policy saw it, in token ids: ``<bos>`` and the prompt, then for each turn its
action, ``<eos>`` and the observation::

    <bos>247-9>200=247-9<eos>=238,238-9<eos>=229,...#193<eos>

Each text is tokenized alone; a character outside the tokenizer's alphabet is ``<unk>``. A
transcript longer than the checkpoint's ``max_tokens`` keeps ``<bos>`` and its last tokens (the
answer is at the end). The model classifies from the last non-pad token (the HF heads' rule), so
batches are right-padded with ``<pad>``.

``reward_meta.json`` beside the weights records the tasks the classifier was trained on (other
tasks are INVALID_ARGUMENT: its score would mean nothing), the rendering and ``max_tokens``, and
the training run's measured held-out accuracy.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from transformers import AutoModelForSequenceClassification, PreTrainedModel, PreTrainedTokenizerFast, Qwen2Config

from services.policy.model import char_tokenizer
from services.reward.protocol import InvalidRequest, RewardRequest, RewardUnavailable, Scored, check_request
from services.reward.registry import MODEL_META

RENDERING = "bos+prompt,(action+eos+observation)*/v1"


@dataclass(frozen=True)
class ClassifierSpec:
    """The built classifier's shape (a tiny Qwen2 with a 2-label head)."""

    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 128
    max_tokens: int = 256  # positions; longer transcripts keep <bos> and their tail
    init_seed: int = 0


def encode(tokenizer: PreTrainedTokenizerFast, request: RewardRequest, max_tokens: int) -> list[int]:
    """The transcript's token ids (the module docstring's rendering), at most ``max_tokens``."""
    ids = [int(tokenizer.bos_token_id), *_ids(tokenizer, request.prompt)]
    for k, action in enumerate(request.actions):
        observation = request.observations[k] if k < len(request.observations) else ""
        ids += [*_ids(tokenizer, action), int(tokenizer.eos_token_id), *_ids(tokenizer, observation)]
    return ids if len(ids) <= max_tokens else ids[:1] + ids[len(ids) - max_tokens + 1:]


def _ids(tokenizer: PreTrainedTokenizerFast, text: str) -> list[int]:
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=False)] if text else []


def build_classifier(spec: ClassifierSpec) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A randomly initialised (seeded) classifier and the character tokenizer."""
    tok = char_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_tokens, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, num_labels=2, tie_word_embeddings=False,
    )
    torch.manual_seed(spec.init_seed)
    return AutoModelForSequenceClassification.from_config(config, dtype=torch.float32), tok


def save_classifier(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, path: str | Path, meta: dict) -> None:
    """Write the checkpoint, its tokenizer and ``reward_meta.json`` (``meta`` plus the rendering)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / MODEL_META).write_text(json.dumps({**meta, "rendering": RENDERING}, indent=2) + "\n")


class ClassifierReward:
    kind: ClassVar[str] = "model"
    judges: ClassVar[bool] = True

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, tasks: Sequence[str],
                 max_tokens: int) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.tasks = tuple(tasks)
        self.max_tokens = max_tokens

    @classmethod
    def load(cls, path: str | Path) -> ClassifierReward:
        """The classifier in ``path`` (`braid reward train`'s output); ``RewardUnavailable`` if it does not load."""
        path = Path(path)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            meta = json.loads((path / MODEL_META).read_text())
            if meta.get("rendering") != RENDERING:
                raise ValueError(f"rendering {meta.get('rendering')!r}, this code renders {RENDERING!r}")
            tokenizer = PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
            model = AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True, dtype=torch.float32)
        except (OSError, ValueError, KeyError) as err:  # mapped: the worker refuses to start with this message
            raise RewardUnavailable(f"cannot load the reward model in {path}: {type(err).__name__}: {err}") from err
        if model.config.num_labels != 2:
            raise RewardUnavailable(
                f"{path}: a reward classifier has 2 labels (wrong, correct), not {model.config.num_labels}"
            )
        return cls(model, tokenizer, meta["tasks"], int(meta["max_tokens"]))

    def score(self, request: RewardRequest) -> Scored:
        check_request(request)
        if request.task not in self.tasks:
            raise InvalidRequest(f"the reward model was trained on tasks {list(self.tasks)}, not {request.task!r}")
        (p,) = self.probabilities([request])
        return Scored(p, {"p_correct": f"{p:.4f}", "correct": str(p >= 0.5).lower()})

    def probabilities(self, requests: Sequence[RewardRequest]) -> list[float]:
        """P(correct) of each transcript (one right-padded batch)."""
        return probabilities(self.model, self.tokenizer, [encode(self.tokenizer, r, self.max_tokens) for r in requests])


def batch(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded input ids and their attention mask."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    return ids, mask


def probabilities(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, rows: Sequence[Sequence[int]]
) -> list[float]:
    ids, mask = batch(rows, int(tokenizer.pad_token_id))
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=mask).logits
    return [float(p) for p in torch.softmax(logits.float(), dim=-1)[:, 1]]
