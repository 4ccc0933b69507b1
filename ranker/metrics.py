"""Ranking metrics for output-length prediction (StreamRL §7.2, Table 4).

``recall_at(pred, true, q)`` -- StreamRL's "recall rate under tail rate q": let k = round(q * n)
(at least 1). The true long tail T is the k samples with the largest true lengths; the predicted
long tail P is the k samples with the largest predicted scores. Recall = |T ∩ P| / k. Both sets
have k members, so this equals precision; 1.0 means the ranker marks exactly the true longest
q-fraction as long-tail (what the dispatcher needs), k/n is what a random ranker gets on average.
Ties are broken by position (stable sort), the same way for truth and prediction, so the metric is
deterministic; a constant prediction therefore scores like an arbitrary (index-order) ranking.

``spearman`` -- Spearman's rank correlation of predictions and true lengths (average ranks for
ties); 0.0 when either side is constant.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

TAIL_RATES = {"recall_at_20": 0.20, "recall_at_10": 0.10, "recall_at_5": 0.05}


def _top(values: np.ndarray, k: int) -> set[int]:
    return set(np.argsort(-values, kind="stable")[:k].tolist())


def recall_at(pred: Sequence[float] | np.ndarray, true: Sequence[float] | np.ndarray, q: float) -> float:
    """Recall of the true longest ``q`` fraction among the predicted longest ``q`` fraction."""
    pred, true = np.asarray(pred, dtype=np.float64), np.asarray(true, dtype=np.float64)
    if pred.shape != true.shape or pred.ndim != 1:
        raise ValueError(f"pred and true must be 1-D of equal length, got {pred.shape} and {true.shape}")
    if not 0.0 < q <= 1.0:
        raise ValueError(f"tail rate q must be in (0, 1], got {q}")
    n = len(true)
    if n == 0:
        raise ValueError("recall of an empty set is undefined")
    k = max(1, round(q * n))
    return len(_top(pred, k) & _top(true, k)) / k


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.arange(len(x), dtype=np.float64)
    # average ranks over ties
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return (sums / counts)[inverse]


def spearman(pred: Sequence[float] | np.ndarray, true: Sequence[float] | np.ndarray) -> float:
    pred, true = np.asarray(pred, dtype=np.float64), np.asarray(true, dtype=np.float64)
    if pred.shape != true.shape or pred.ndim != 1:
        raise ValueError(f"pred and true must be 1-D of equal length, got {pred.shape} and {true.shape}")
    if len(pred) < 2:
        return 0.0
    a, b = _ranks(pred), _ranks(true)
    a, b = a - a.mean(), b - b.mean()
    denom = float(np.sqrt((a * a).sum() * (b * b).sum()))
    return 0.0 if denom == 0.0 else float((a * b).sum() / denom)


def evaluate(pred: Sequence[float] | np.ndarray, true: Sequence[float] | np.ndarray) -> dict[str, float | int]:
    """``n``, ``recall_at_20``, ``recall_at_10``, ``recall_at_5``, ``spearman``."""
    out: dict[str, float | int] = {"n": len(true)}
    for name, q in TAIL_RATES.items():
        out[name] = round(recall_at(pred, true, q), 4)
    out["spearman"] = round(spearman(pred, true), 4)
    return out
