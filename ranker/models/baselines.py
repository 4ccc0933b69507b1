"""Baselines: prompt length, and TF-IDF + a linear model on log length.

- ``prompt_length``: longer prompt = longer output. The estimate is ``c * chars`` with
  ``log c`` the mean of ``log(length) - log(chars)`` on the training set (monotone in length).
- ``tfidf_linear``: TF-IDF of word uni/bigrams (sublinear tf) and ridge regression on the log
  length; ``alpha`` is the ridge strength.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ranker.base import Ranker, register
from ranker.textvec import TfidfText


@register("prompt_length")
class PromptLengthRanker(Ranker):
    def __init__(self) -> None:
        super().__init__()
        self.log_scale = 0.0

    def _fit(self, prompts: list[str], log_lengths: np.ndarray) -> None:
        self.log_scale = float(np.mean(log_lengths - np.log([len(p) for p in prompts])))

    def _score(self, prompts: list[str]) -> np.ndarray:
        return self.log_scale + np.log([max(1, len(p)) for p in prompts])

    def _save(self, directory: Path) -> None:
        (directory / "prompt_length.json").write_text(json.dumps({"log_scale": self.log_scale}))

    def _load(self, directory: Path) -> None:
        self.log_scale = float(json.loads((directory / "prompt_length.json").read_text())["log_scale"])


@register("tfidf_linear")
class TfidfLinearRanker(Ranker):
    def __init__(self, alpha: float = 1.0, min_df: int = 2) -> None:
        if not alpha > 0:
            raise ValueError(f"alpha must be > 0, got {alpha}")
        super().__init__(alpha=alpha, min_df=min_df)
        self.vec = TfidfText(min_df=min_df)
        self.coef = np.zeros(0)
        self.intercept = 0.0

    def _fit(self, prompts: list[str], log_lengths: np.ndarray) -> None:
        from sklearn.linear_model import Ridge

        x = self.vec.fit(prompts).transform(prompts)
        model = Ridge(alpha=self.params["alpha"]).fit(x, log_lengths)
        self.coef, self.intercept = np.asarray(model.coef_, dtype=np.float64), float(model.intercept_)

    def _score(self, prompts: list[str]) -> np.ndarray:
        return np.asarray(self.vec.transform(prompts) @ self.coef).ravel() + self.intercept

    def _save(self, directory: Path) -> None:
        self.vec.save(directory, "tfidf")
        np.save(directory / "ridge_coef.npy", self.coef)
        (directory / "ridge.json").write_text(json.dumps({"intercept": self.intercept}))

    def _load(self, directory: Path) -> None:
        self.vec = TfidfText.load(directory, "tfidf")
        self.coef = np.load(directory / "ridge_coef.npy")
        self.intercept = float(json.loads((directory / "ridge.json").read_text())["intercept"])
