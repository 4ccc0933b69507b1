"""Ensemble (kind ``ensemble``): a weighted mean of member rankers' log-length predictions.

Members are other registered kinds (default: ``lightgbm`` and ``transformer``), trained on the
same data; their errors are partly independent (hand features and TF-IDF vs a fine-tuned
encoder), so averaging their log lengths ranks better than either when both are good.
Saved as one sub-directory per member (each a complete ranker directory).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ranker.base import Ranker, create, load_ranker, register


@register("ensemble")
class EnsembleRanker(Ranker):
    def __init__(self, members: Sequence[str] = ("lightgbm", "transformer"), weights: Sequence[float] | None = None,
                 member_params: dict[str, dict] | None = None) -> None:
        members = list(members)
        if not members or "ensemble" in members:
            raise ValueError(f"members must be a non-empty list of other kinds, got {members}")
        weights = [1.0] * len(members) if weights is None else [float(w) for w in weights]
        if len(weights) != len(members) or any(w < 0 for w in weights) or sum(weights) <= 0:
            raise ValueError(f"weights must be {len(members)} non-negative numbers with a positive sum, got {weights}")
        super().__init__(members=members, weights=weights, member_params=dict(member_params or {}))
        self.models: list[Ranker] = []

    @classmethod
    def from_members(cls, models: Sequence[Ranker], weights: Sequence[float] | None = None) -> EnsembleRanker:
        """An ensemble of already-trained rankers (no retraining)."""
        out = cls(members=[m.kind for m in models], weights=weights,
                  member_params={m.kind: m.params for m in models})
        out.models = list(models)
        out.unit = models[0].unit
        out.train_info = {"n": models[0].train_info.get("n"), "source": models[0].train_info.get("source"),
                          "seconds": round(sum(m.train_info.get("seconds", 0.0) for m in models), 2)}
        return out

    def _fit(self, prompts: list[str], log_lengths: np.ndarray) -> None:
        lengths = np.exp(log_lengths)
        self.models = [create(kind, **self.params["member_params"].get(kind, {})).fit(prompts, lengths)
                       for kind in self.params["members"]]

    def _score(self, prompts: list[str]) -> np.ndarray:
        w = np.asarray(self.params["weights"], dtype=np.float64)
        scores = np.stack([np.log(m.predict(prompts)) for m in self.models])
        return (w[:, None] * scores).sum(0) / w.sum()

    def _save(self, directory: Path) -> None:
        for i, m in enumerate(self.models):
            m.save(directory / f"member_{i}")

    def _load(self, directory: Path) -> None:
        self.models = []
        for i, kind in enumerate(self.params["members"]):
            model = load_ranker(directory / f"member_{i}")
            if model.kind != kind:
                raise FileNotFoundError(f"{directory / f'member_{i}'} holds a {model.kind!r} ranker, expected {kind!r}")
            self.models.append(model)
