"""Train, evaluate and annotate: the steps behind ``braid ranker`` and the retrain flow.

- ``train(data, out, kind)``: fit a registered kind on a JSONL file and save it to ``out``;
- ``evaluate_ranker(ranker, data)``: ``n``, ``recall_at_20/10/5`` and ``spearman`` (``ranker.metrics``)
  plus the ranker's kind and unit;
- ``annotate(ranker, prompts_file, out)``: StreamRL's one-time offline pass: every row of a
  prompts file gets ``estimated_length`` (other fields kept).

Units: a file converted from MMLU-Pro is in characters, one from the generation log in tokens;
``guess_unit`` reads the unit from a ``unit`` sidecar (``<file>.unit``) when present.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ranker.base import Ranker, create
from ranker.data import Dataset, load_dataset, load_prompts, write_jsonl
from ranker.metrics import evaluate


def guess_unit(path: str | Path) -> str:
    side = Path(str(path) + ".unit")
    if side.is_file():
        unit = side.read_text().strip()
        if unit in ("characters", "tokens"):
            return unit
    return "unknown"


def write_unit(path: str | Path, unit: str) -> None:
    Path(str(path) + ".unit").write_text(unit + "\n")


def train(data: str | Path | Dataset, out: str | Path | None, kind: str = "lightgbm",
          params: dict[str, Any] | None = None, unit: str | None = None) -> Ranker:
    """Fit ``kind`` on ``data`` (a JSONL path or a Dataset); save to ``out`` when given."""
    dataset = data if isinstance(data, Dataset) else load_dataset(data)
    if unit is None:
        unit = "unknown" if isinstance(data, Dataset) else guess_unit(data)
    model = create(kind, **(params or {}))
    model.fit(dataset.prompts, dataset.lengths, unit=unit, source=dataset.source)
    if out is not None:
        model.save(out)
    return model


def evaluate_ranker(model: Ranker, data: str | Path | Dataset) -> dict[str, Any]:
    dataset = data if isinstance(data, Dataset) else load_dataset(data)
    result: dict[str, Any] = dict(evaluate(model.predict(dataset.prompts), dataset.lengths))
    result.update(kind=model.kind, unit=model.unit)
    return result


def annotate(model: Ranker, prompts_file: str | Path, out: str | Path, keep_prompt: bool = True) -> int:
    """Write ``prompts_file``'s rows with ``estimated_length`` added; returns the row count."""
    rows = [obj for _, obj in load_prompts(prompts_file)]
    estimates = model.predict([r["prompt"] for r in rows])
    for row, est in zip(rows, estimates, strict=True):
        row["estimated_length"] = round(float(est), 2)
        if not keep_prompt:
            row.pop("prompt", None)
    return write_jsonl(out, rows)
