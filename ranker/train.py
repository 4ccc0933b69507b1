"""Train, evaluate and annotate: the steps behind ``braid ranker`` and the retrain flow.

- ``train(data, out, kind)``: fit a registered kind on a JSONL file and save it to ``out``;
- ``evaluate_ranker(ranker, data)``: ``n``, ``recall_at_20/10/5`` and ``spearman`` (``ranker.metrics``)
  plus the ranker's kind and unit and the data's unit (``unit_mismatch`` warns when they differ);
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


def evaluate_ranker(model: Ranker, data: str | Path | Dataset, data_unit: str | None = None) -> dict[str, Any]:
    """Metrics of ``model`` on ``data``, its kind and unit, and ``data_unit`` (given, else the file's
    ``.unit`` sidecar)."""
    dataset = data if isinstance(data, Dataset) else load_dataset(data)
    if data_unit is None:
        data_unit = "unknown" if isinstance(data, Dataset) else guess_unit(data)
    result: dict[str, Any] = dict(evaluate(model.predict(dataset.prompts), dataset.lengths))
    result.update(kind=model.kind, unit=model.unit, data_unit=data_unit)
    return result


def unit_mismatch(result: dict[str, Any]) -> str | None:
    """A warning when ``evaluate_ranker``'s ranker and data measure lengths in different known units."""
    unit, data_unit = result.get("unit", "unknown"), result.get("data_unit", "unknown")
    if "unknown" in (unit, data_unit) or unit == data_unit:
        return None
    return (f"warning: the ranker was trained on response lengths in {unit}, the data's are in {data_unit}: "
            f"it ranks a different length than it learned (train it on {data_unit}, e.g. from `braid ranker "
            f"convert-log` for tokens)")


def annotate(model: Ranker, prompts_file: str | Path, out: str | Path, keep_prompt: bool = True) -> int:
    """Write ``prompts_file``'s rows with ``estimated_length`` added; returns the row count."""
    rows = [obj for _, obj in load_prompts(prompts_file)]
    estimates = model.predict([r["prompt"] for r in rows])
    for row, est in zip(rows, estimates, strict=True):
        row["estimated_length"] = round(float(est), 2)
        if not keep_prompt:
            row.pop("prompt", None)
    return write_jsonl(out, rows)
