"""The ranker interface, the model registry and the on-disk format.

A ranker maps prompts to an **estimated response length** in the unit of its training data
(characters or tokens); higher means longer. Every model here regresses the log of the length
and predicts ``exp(score)`` (the conditional geometric mean), so the estimate is strictly
monotone in the model's score: sorting by it is sorting by the model's belief. Only the order
matters to the dispatcher's long-tail split and to LPT; the magnitude is what the SGS's load
estimates see.

Registry: ``@register("name")`` on a ``Ranker`` subclass; ``create(kind, **params)`` builds one,
``kinds()`` lists them (``ranker.models`` imports every model module; heavy libraries are
imported inside the methods that need them, so listing kinds is cheap).

Saved format: a directory with ``ranker.json`` (the manifest) plus model files::

    {"format": "braid-ranker", "format_version": 1, "kind": "lightgbm", "params": {...},
     "unit": "characters", "train": {"n": 8422, "source": "...", "seconds": 41.2}, ...}

``load_ranker(dir)`` checks the manifest and raises ``RankerFormatError`` naming the file and the
field when the directory is not a ranker, was written by another format version, or names an
unknown kind.
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

FORMAT = "braid-ranker"
FORMAT_VERSION = 1
MANIFEST = "ranker.json"
UNITS = ("characters", "tokens", "unknown")

_REGISTRY: dict[str, type[Ranker]] = {}


class RankerFormatError(ValueError):
    """A ranker directory is missing, not a ranker, or of another format version."""


def register(kind: str):
    """Class decorator: make a ``Ranker`` subclass available under ``kind``."""

    def deco(cls: type[Ranker]) -> type[Ranker]:
        if kind in _REGISTRY and _REGISTRY[kind] is not cls:
            raise ValueError(f"ranker kind {kind!r} registered twice")
        cls.kind = kind
        _REGISTRY[kind] = cls
        return cls

    return deco


def _ensure_models() -> None:
    import ranker.models  # noqa: F401  (registers every kind)


def kinds() -> list[str]:
    _ensure_models()
    return sorted(_REGISTRY)


def ranker_class(kind: str) -> type[Ranker]:
    _ensure_models()
    if kind not in _REGISTRY:
        raise ValueError(f"unknown ranker kind {kind!r}; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[kind]


def create(kind: str, **params: Any) -> Ranker:
    cls = ranker_class(kind)
    try:
        return cls(**params)
    except TypeError as err:  # an unknown parameter, or a value of the wrong type
        raise ValueError(f"{kind} ranker: parameters {params} do not fit: {err}") from None


class Ranker(ABC):
    """Predicts relative output length from prompt text. Subclasses implement the ``_`` methods.

    ``params`` are the constructor's keyword arguments (JSON values), stored in the manifest and
    passed back on load.
    """

    kind: ClassVar[str] = "abstract"

    def __init__(self, **params: Any) -> None:
        self.params: dict[str, Any] = params
        self.unit = "unknown"
        self.train_info: dict[str, Any] = {}

    # --- what a model implements ---------------------------------------------------------------
    @abstractmethod
    def _fit(self, prompts: list[str], log_lengths: np.ndarray) -> None: ...

    @abstractmethod
    def _score(self, prompts: list[str]) -> np.ndarray:
        """Predicted log length per prompt."""

    @abstractmethod
    def _save(self, directory: Path) -> None: ...

    @abstractmethod
    def _load(self, directory: Path) -> None: ...

    # --- the public interface ----------------------------------------------------------------------
    def fit(self, prompts: Sequence[str], lengths: Sequence[float] | np.ndarray, unit: str = "unknown",
            source: str = "<memory>") -> Ranker:
        prompts = list(prompts)
        y = np.asarray(lengths, dtype=np.float64)
        if len(prompts) != len(y):
            raise ValueError(f"{len(prompts)} prompts but {len(y)} lengths")
        if len(prompts) < 2:
            raise ValueError(f"need at least 2 training examples, got {len(prompts)}")
        if np.any(~np.isfinite(y)) or np.any(y <= 0):
            raise ValueError("every length must be a positive finite number")
        if unit not in UNITS:
            raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")
        start = time.perf_counter()
        self._fit(prompts, np.log(y))
        self.unit = unit
        self.train_info = {"n": len(prompts), "source": source, "seconds": round(time.perf_counter() - start, 2)}
        return self

    def predict(self, prompts: Sequence[str]) -> np.ndarray:
        """Estimated response length per prompt (training data's unit); higher = longer."""
        prompts = list(prompts)
        if not prompts:
            return np.zeros(0, dtype=np.float64)
        if any(not isinstance(p, str) for p in prompts):
            raise TypeError("prompts must be strings")
        scores = np.asarray(self._score(prompts), dtype=np.float64)
        return np.exp(np.clip(scores, -50.0, 50.0))

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._save(directory)
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "kind": self.kind,
            "params": self.params,
            "unit": self.unit,
            "train": self.train_info,
            "saved_at": time.time(),
        }
        tmp = directory / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=2))
        tmp.replace(directory / MANIFEST)  # the manifest last: a directory with one is complete
        return directory


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """The validated manifest of a saved ranker directory (errors name the file and field)."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not directory.is_dir():
        raise RankerFormatError(f"{directory}: not a directory (expected a saved ranker)")
    if not path.is_file():
        raise RankerFormatError(f"{path}: missing; {directory} is not a saved ranker")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise RankerFormatError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise RankerFormatError(f"{path}: field 'format' is {got!r}, expected {FORMAT!r}; not a Braid ranker")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise RankerFormatError(
            f"{path}: field 'format_version' is {version!r}; this Braid reads version {FORMAT_VERSION} "
            "(retrain the ranker with this version)"
        )
    for field, typ in (("kind", str), ("params", dict), ("unit", str)):
        if not isinstance(manifest.get(field), typ):
            raise RankerFormatError(f"{path}: field {field!r} is missing or not a {typ.__name__}")
    if not isinstance(manifest.get("train") or {}, dict):
        raise RankerFormatError(f"{path}: field 'train' is not an object")
    _ensure_models()
    if manifest["kind"] not in _REGISTRY:
        raise RankerFormatError(
            f"{path}: field 'kind' is {manifest['kind']!r}; known kinds: {', '.join(sorted(_REGISTRY))}"
        )
    return manifest


def load_ranker(directory: str | Path) -> Ranker:
    """Load a ranker saved by ``Ranker.save`` (any registered kind)."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    try:
        model = create(manifest["kind"], **manifest["params"])
    except ValueError as err:
        raise RankerFormatError(f"{directory / MANIFEST}: field 'params': {err}") from None
    model.unit = manifest["unit"]
    model.train_info = dict(manifest.get("train") or {})
    try:
        model._load(directory)
    except FileNotFoundError as err:
        raise RankerFormatError(f"{directory}: incomplete ranker ({err})") from None
    except (ValueError, KeyError, TypeError, IndexError) as err:  # a damaged model file
        raise RankerFormatError(f"{directory}: damaged ranker ({type(err).__name__}: {err})") from None
    return model
