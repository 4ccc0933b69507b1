"""TF-IDF text vectors with a pickle-free save format (vocabulary + idf in ``.npz``/``.json``).

Fitting uses scikit-learn's ``TfidfVectorizer`` (word 1-2-grams, sublinear tf, l2 norm); the
saved state is the vocabulary and idf vector, and ``transform`` rebuilds the same matrix with a
fixed-vocabulary ``CountVectorizer``, so a ranker directory never unpickles code.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

_SETTINGS = {"ngram_range": (1, 2), "lowercase": True, "token_pattern": r"(?u)\b\w+\b|[^\w\s]"}


class TfidfText:
    def __init__(self, min_df: int = 2, max_features: int | None = 200_000) -> None:
        self.min_df, self.max_features = min_df, max_features
        self.vocabulary: dict[str, int] = {}
        self.idf = np.zeros(0)

    def fit(self, texts: Sequence[str]) -> TfidfText:
        from sklearn.feature_extraction.text import TfidfVectorizer

        min_df = self.min_df if len(texts) >= 4 * self.min_df else 1
        vec = TfidfVectorizer(sublinear_tf=True, min_df=min_df, max_features=self.max_features, **_SETTINGS)
        vec.fit(texts)
        self.vocabulary = {str(k): int(v) for k, v in vec.vocabulary_.items()}
        self.idf = np.asarray(vec.idf_, dtype=np.float64)
        return self

    def transform(self, texts: Sequence[str]):
        from sklearn.feature_extraction.text import CountVectorizer
        from sklearn.preprocessing import normalize

        counts = CountVectorizer(vocabulary=self.vocabulary, **_SETTINGS).transform(texts).astype(np.float64)
        counts.data = np.log(counts.data) + 1.0  # sublinear tf
        return normalize(counts.multiply(self.idf).tocsr(), norm="l2", copy=False)

    def save(self, directory: Path, name: str) -> None:
        (directory / f"{name}_vocab.json").write_text(json.dumps(self.vocabulary))
        np.save(directory / f"{name}_idf.npy", self.idf)

    @classmethod
    def load(cls, directory: Path, name: str) -> TfidfText:
        out = cls()
        out.vocabulary = json.loads((directory / f"{name}_vocab.json").read_text())
        out.idf = np.load(directory / f"{name}_idf.npy")
        return out
