"""Output-length ranker (StreamRL §5): predicts which prompts will generate long outputs.

Public API (what the SGS uses)::

    from ranker import load_ranker
    r = load_ranker("path/to/ranker_dir")     # -> Ranker
    r.kind                                    # "lightgbm" | "transformer" | "ensemble" | baselines
    r.predict(["prompt", ...])                # numpy float array: estimated length, higher = longer

Training, evaluation and annotation: ``ranker.train`` (also ``braid ranker ...``); hot swap:
``ranker.store`` (``RankerStore``, ``RankerWatcher``). Importing this package is cheap: numpy,
scikit-learn, LightGBM and torch are imported only by the code that needs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ranker.base import Ranker

__all__ = ["Ranker", "RankerFormatError", "RankerStore", "RankerWatcher", "kinds", "load_ranker"]


def load_ranker(path: Any) -> Ranker:
    """Load a saved ranker directory; raises ``RankerFormatError`` naming the file and field."""
    from ranker.base import load_ranker as _load

    return _load(path)


def __getattr__(name: str) -> Any:
    if name in ("Ranker", "RankerFormatError", "kinds"):
        from ranker import base

        return getattr(base, name)
    if name in ("RankerStore", "RankerWatcher"):
        from ranker import store

        return getattr(store, name)
    raise AttributeError(f"module 'ranker' has no attribute {name!r}")
