"""The user's own prompts and reference answers, read from local files (config: ``task.dataset``).

Formats, chosen by the file name's suffix (case-insensitive):

* ``.jsonl`` / ``.ndjson``: one JSON object per line; blank lines are skipped. Rows are located as
  ``<file>:<line>`` (1-based).
* ``.json``: one JSON array of objects. Rows are located as ``<file>:row <i>`` (0-based).
* ``.parquet``: read whole with pyarrow. Rows are located as ``<file>:row <i>`` (0-based).
* ``.jsonl.gz`` / ``.ndjson.gz`` / ``.json.gz``: the same, gzip-compressed.

Each row becomes a ``DatasetItem``: the user message is ``DatasetConfig.template`` with ``{prompt}``
replaced by the text of ``prompt_field`` (``str.replace``, so braces in the data or the template are
never interpreted); the reference answer is ``answer_field`` as text (a string, or an int/float
written with ``str``; booleans, nulls, lists, objects and non-finite numbers are refused); the whole
row travels along as compact JSON for user reward functions. Sizes are bounded by the reward
protocol's limits (``MAX_DATASET_TEXT_CHARS`` for the prompt as the model sees it, system prompt
included, and for the answer; ``MAX_ROW_JSON_CHARS`` for the row). Validation fails fast: the first
bad row raises ``DatasetError`` naming the file, the line or row, and the field.

The held-out set (``load_dataset``) is ``eval.prompts`` rows drawn by ``eval.seed`` from the
``heldout`` file, else from ``train`` (those rows then leave training): the row indices shuffled by
``random.Random(eval_seed)``, a prefix taken, so a smaller ``eval.prompts`` holds out a prefix of a
larger one's set (ids ``e0``, ``e1``, ... in drawn order). Training rows whose prompt text equals a
held-out prompt are dropped: duplicated data cannot leak the held-out set into training.

An evaluation suite (``load_suite``, config ``eval.suites``) is read the same way with its own field
mapping (``RowsConfig``, the fields a suite shares with ``task.dataset``): every row, or ``prompts``
of them drawn by ``eval.seed`` as above, ids ``<suite name>:<i>``.

``DatasetSampler`` walks the training rows in epochs: epoch ``e`` visits every row exactly once,
in file order or (``shuffle``) in an order fixed by ``seed`` and ``e`` alone (a string seed, which
``random`` hashes with SHA-512, so the order does not depend on the process). Its cursor
``(epoch, position, count)`` is plain integers: ``restore`` on a fresh sampler over the same rows
continues the identical stream, so a restarted run draws each prompt exactly once. With ``epochs``
set, drawing past ``epochs`` passes raises ``DatasetExhausted``; ``prompts_needed_check`` refuses
such a run before it starts. Nothing here touches global random state.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import random
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from services.common.task_config import MAX_DATASET_TEXT_CHARS, MAX_ROW_JSON_CHARS, DatasetConfig, RowsConfig

FORMATS = (".jsonl", ".ndjson", ".json", ".parquet")
COMPRESSED = (".jsonl.gz", ".ndjson.gz", ".json.gz")
_MAX_KEYS_SHOWN = 20


class DatasetError(ValueError):
    """A data file, row or field the task cannot use; the message names the file, the line (JSONL,
    1-based) or row (JSON array and Parquet, 0-based row index) and the field."""


class DatasetExhausted(RuntimeError):
    """The sampler has drawn all ``epochs`` passes over the training rows. A run state, not a data
    error (hence not a ``DatasetError``): ``prompts_needed_check`` refuses such a run up front."""


@dataclass(frozen=True)
class DatasetItem:
    """One prompt of the task with its reference answer and source row."""

    prompt_id: str  # "d<count>" for training draws, "e<i>" held out, "" straight from read_rows
    prompt: str  # the user message: the template with the prompt field's text in place
    answer: str  # the reference answer as text
    row_json: str  # the whole source row as compact JSON
    source: str  # "<file>:<line>" (JSONL) or "<file>:row <i>" (JSON array, Parquet)
    task: str  # DatasetConfig.name
    difficulty: int = 0  # the count-down task's breakdown key; datasets have no difficulty scale
    system: str | None = None  # DatasetConfig.system_prompt
    group: str = ""  # the row's DatasetConfig.group_field value: the evaluation breakdown's key ("" = none)

    @property
    def reference(self) -> str:
        """The text a reward request carries as the reference (``services.tasks.source``)."""
        return self.answer


def _kind(value: Any) -> str:
    """A value's type in JSON terms, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    names = {str: "string", list: "array", tuple: "array", dict: "object"}
    return names.get(type(value), type(value).__name__)


def _format(path: Path, shown: str) -> tuple[str, bool]:
    """(format suffix, gzip-compressed) of a data file, from its name."""
    name = path.name.lower()
    for suffix in FORMATS + COMPRESSED:
        if name.endswith(suffix):
            return suffix.removesuffix(".gz"), suffix.endswith(".gz")
    raise DatasetError(f"{shown}: unsupported file type; supported: {', '.join(FORMATS + COMPRESSED)}")


def _check_file(path: Path, shown: str) -> None:
    if not path.exists():
        raise DatasetError(f"{shown}: no such file")
    if path.is_dir():
        raise DatasetError(f"{shown}: is a directory, not a data file")


def _read_bytes(path: Path, shown: str, compressed: bool) -> bytes:
    try:
        if compressed:
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except (OSError, EOFError, zlib.error) as e:
        raise DatasetError(f"{shown}: cannot read the file ({e})") from e


def _parse(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DatasetError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from e
    except (ValueError, RecursionError) as e:  # over-long integers, too deep nesting
        raise DatasetError(f"{where}: not usable JSON ({type(e).__name__}: {e})") from e


def _jsonl_rows(data: bytes, shown: str) -> Iterator[tuple[str, Any]]:
    for number, raw in enumerate(data.split(b"\n"), start=1):
        where = f"{shown}:{number}"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DatasetError(f"{where}: not UTF-8 text (bad byte at column {e.start + 1})") from e
        if number == 1:
            text = text.removeprefix("\ufeff")
        if text.strip():
            yield where, _parse(text, where)


def _json_rows(data: bytes, shown: str) -> Iterator[tuple[str, Any]]:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise DatasetError(f"{shown}:{line}: not UTF-8 text (bad byte at file offset {e.start})") from e
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise DatasetError(f"{shown}:{e.lineno}: not valid JSON ({e.msg} at column {e.colno})") from e
    except (ValueError, RecursionError) as e:
        raise DatasetError(f"{shown}: not usable JSON ({type(e).__name__}: {e})") from e
    if not isinstance(doc, list):
        raise DatasetError(f"{shown}: expected a JSON array of objects, got {_kind(doc)}")
    for i, row in enumerate(doc):
        yield f"{shown}:row {i}", row


def _parquet_rows(path: Path, shown: str, cfg: RowsConfig) -> Iterator[tuple[str, Any]]:
    import pyarrow as pa  # imported on use: JSON datasets need no pyarrow
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as e:
        raise DatasetError(f"{shown}: not a readable Parquet file ({e})") from e
    columns = table.column_names
    missing = [f for f in (cfg.prompt_field, cfg.answer_field) if f not in columns]
    if missing:
        raise DatasetError(
            f"{shown}: no column {' or '.join(repr(m) for m in missing)} "
            f"(columns: {', '.join(repr(c) for c in columns) or 'none'})"
        )
    for i, row in enumerate(table.to_pylist()):
        yield f"{shown}:row {i}", row


def _keys(row: dict) -> str:
    keys = [repr(k) for k in list(row)[:_MAX_KEYS_SHOWN]]
    more = f", ... ({len(row)} keys)" if len(row) > _MAX_KEYS_SHOWN else ""
    return (", ".join(keys) or "none") + more


def _prompt_text(where: str, row: dict, field: str) -> str:
    if field not in row:
        raise DatasetError(f"{where}: prompt field {field!r} is missing (row keys: {_keys(row)})")
    text = row[field]
    if not isinstance(text, str):
        raise DatasetError(f"{where}: prompt field {field!r} must be a non-empty string, got {_kind(text)}")
    if not text.strip():
        raise DatasetError(f"{where}: prompt field {field!r} must be a non-empty string, got an empty string")
    return text


def _answer_text(where: str, row: dict, field: str) -> str:
    if field not in row:
        raise DatasetError(f"{where}: answer field {field!r} is missing (row keys: {_keys(row)})")
    value = row[field]
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            raise DatasetError(f"{where}: answer field {field!r} must be a finite number, got {value}")
        return str(value)
    raise DatasetError(f"{where}: answer field {field!r} must be a string or a number, got {_kind(value)}")


def _item(where: str, row: Any, cfg: RowsConfig) -> DatasetItem:
    """One validated row (``prompt_id`` left empty)."""
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected a JSON object, got {_kind(row)}")
    text = _prompt_text(where, row, cfg.prompt_field)
    answer = _answer_text(where, row, cfg.answer_field)
    prompt = cfg.template.replace("{prompt}", text)
    system = len(cfg.system_prompt) + 2 if cfg.system_prompt else 0  # the system text and a blank line
    if len(prompt) + system > MAX_DATASET_TEXT_CHARS:
        raise DatasetError(
            f"{where}: prompt field {cfg.prompt_field!r} makes a prompt of {len(prompt) + system} characters "
            f"(field {len(text)}, template and system prompt {len(prompt) + system - len(text)}; "
            f"limit {MAX_DATASET_TEXT_CHARS})"
        )
    if len(answer) > MAX_DATASET_TEXT_CHARS:
        raise DatasetError(
            f"{where}: answer field {cfg.answer_field!r} is {len(answer)} characters (limit {MAX_DATASET_TEXT_CHARS})"
        )
    row_json = json.dumps(row, ensure_ascii=False, separators=(",", ":"), default=str)
    if len(row_json) > MAX_ROW_JSON_CHARS:
        raise DatasetError(f"{where}: the row is {len(row_json)} characters as JSON (limit {MAX_ROW_JSON_CHARS})")
    group = row.get(cfg.group_field) if cfg.group_field else None
    return DatasetItem(
        prompt_id="", prompt=prompt, answer=answer, row_json=row_json, source=where,
        task=cfg.name, system=cfg.system_prompt, group="" if group is None else str(group)[:64],
    )


def read_rows(path: str | Path, cfg: RowsConfig) -> list[DatasetItem]:
    """Every row of a data file, validated, in file order (``prompt_id`` empty)."""
    shown, file = str(path), Path(path)
    suffix, compressed = _format(file, shown)
    _check_file(file, shown)
    if suffix == ".parquet":
        rows = _parquet_rows(file, shown, cfg)
    else:
        data = _read_bytes(file, shown, compressed)
        rows = _json_rows(data, shown) if suffix == ".json" else _jsonl_rows(data, shown)
    items = [_item(where, row, cfg) for where, row in rows]
    if not items:
        raise DatasetError(f"{shown}: no rows (the file holds no data)")
    return items


def _draw(count: int, n: int, seed: int) -> list[int]:
    """``n`` of ``count`` row indices without replacement: a prefix of the indices shuffled by ``seed``."""
    order = list(range(count))
    random.Random(seed).shuffle(order)
    return order[:n]


def load_dataset(
    cfg: DatasetConfig, eval_prompts: int, eval_seed: int
) -> tuple[list[DatasetItem], list[DatasetItem]]:
    """(training rows, held-out items with ids ``e0..``); see the module docstring."""
    if eval_prompts < 0:
        raise ValueError(f"eval_prompts must be >= 0, got {eval_prompts}")
    train = read_rows(cfg.train, cfg)
    if cfg.heldout is not None:
        pool = read_rows(cfg.heldout, cfg)
        held = [pool[i] for i in _draw(len(pool), eval_prompts, eval_seed)]
    else:
        if len(train) - eval_prompts < 1:
            raise DatasetError(
                f"{cfg.train}: {len(train)} rows, and eval.prompts asks for {eval_prompts} of them held out, "
                "leaving no training row (lower eval.prompts or give task.dataset.heldout)"
            )
        drawn = _draw(len(train), eval_prompts, eval_seed)
        held = [train[i] for i in drawn]
        chosen = set(drawn)
        train = [item for i, item in enumerate(train) if i not in chosen]
    held = [replace(item, prompt_id=f"e{i}") for i, item in enumerate(held)]
    held_prompts = {item.prompt for item in held}
    kept = [item for item in train if item.prompt not in held_prompts]
    if not kept:
        raise DatasetError(
            f"{cfg.train}: all {len(train)} training rows repeat a held-out prompt; no training row remains"
        )
    return kept, held


def load_suite(path: str | Path, cfg: RowsConfig, prompts: int | None, seed: int) -> list[DatasetItem]:
    """An evaluation suite's items (``eval.suites``): every row of ``path`` in file order, or ``prompts``
    of them drawn by ``seed`` as the held-out set is; ids ``<name>:<i>`` (``:`` is in no suite name)."""
    rows = read_rows(path, cfg)
    if prompts is not None:
        if prompts > len(rows):
            raise DatasetError(f"{path}: {len(rows)} rows, fewer than the suite's prompts ({prompts})")
        rows = [rows[i] for i in _draw(len(rows), prompts, seed)]
    return [replace(item, prompt_id=f"{cfg.name}:{i}") for i, item in enumerate(rows)]


class DatasetSampler:
    """Epochs over the training rows, each a full pass in a seeded order; see the module docstring."""

    def __init__(
        self,
        rows: list[DatasetItem],
        seed: int,
        *,
        shuffle: bool = True,
        epochs: int | None = None,
        prefix: str = "d",
    ) -> None:
        if not rows:
            raise DatasetError("no training rows to sample from")
        if epochs is not None and epochs < 1:
            raise ValueError(f"epochs must be >= 1 or None, got {epochs}")
        self._rows = list(rows)
        self._seed = seed
        self._shuffle = shuffle
        self._epochs = epochs
        self._prefix = prefix
        self._epoch = self._position = self._count = 0
        self._order: list[int] = []
        self._order_epoch = -1  # the epoch ``_order`` belongs to; computed on first use

    @property
    def epoch(self) -> int:
        """The epoch the next draw comes from (0-based)."""
        return self._epoch

    @property
    def rows_per_epoch(self) -> int:
        return len(self._rows)

    @property
    def count(self) -> int:
        """Draws so far (the number in the next prompt id)."""
        return self._count

    @property
    def remaining(self) -> int | None:
        """Draws left before ``DatasetExhausted``; None when ``epochs`` is unlimited."""
        if self._epochs is None:
            return None
        return max(0, (self._epochs - self._epoch) * len(self._rows) - self._position)

    def _order_of(self, epoch: int) -> list[int]:
        order = list(range(len(self._rows)))
        if self._shuffle:
            random.Random(f"braid.dataset:{self._seed}:{epoch}").shuffle(order)
        return order

    def _exhausted(self, asked: int) -> DatasetExhausted:
        return DatasetExhausted(
            f"asked for {asked} more prompt(s) but only {self.remaining} remain of epochs={self._epochs} x "
            f"{len(self._rows)} rows ({self._count} drawn)"
        )

    def sample(self) -> DatasetItem:
        if self._epochs is not None and self._epoch >= self._epochs:
            raise self._exhausted(1)
        if self._order_epoch != self._epoch:
            self._order, self._order_epoch = self._order_of(self._epoch), self._epoch
        row = self._rows[self._order[self._position]]
        item = replace(row, prompt_id=f"{self._prefix}{self._count}")
        self._count += 1
        self._position += 1
        if self._position == len(self._rows):
            self._epoch, self._position = self._epoch + 1, 0
        return item

    def batch(self, n: int) -> list[DatasetItem]:
        """``n`` draws, all or none: too few left raises before anything is drawn."""
        if n < 0:
            raise ValueError(f"batch size must be >= 0, got {n}")
        remaining = self.remaining
        if remaining is not None and remaining < n:
            raise self._exhausted(n)
        return [self.sample() for _ in range(n)]

    def state(self) -> tuple:
        """The data cursor ``(epoch, position, count)``: what ``restore`` needs to continue from here."""
        return self._epoch, self._position, self._count

    def restore(self, state: tuple) -> None:
        """Continue from ``state`` (taken from a sampler over the same rows, seed and shuffle)."""
        n = len(self._rows)
        if not (
            isinstance(state, (tuple, list)) and len(state) == 3
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in state)
        ):
            raise DatasetError(f"sampler state {state!r} is not (epoch, position, count) of integers >= 0")
        epoch, position, count = state
        if position >= n or epoch * n + position != count:
            raise DatasetError(
                f"sampler state {tuple(state)!r} does not fit {n} training rows (position must be < {n} "
                f"and epoch x {n} + position == count): the training rows changed since it was taken"
            )
        self._epoch, self._position, self._count = epoch, position, count


def prompts_needed_check(rows: int, epochs: int | None, needed: int, name: str) -> None:
    """Refuse a run that needs more than ``epochs`` x ``rows`` prompts (``epochs`` None: no limit)."""
    if epochs is None:
        return
    if rows < 1:
        raise DatasetError(f"{name}: no training rows")
    if epochs * rows < needed:
        enough = -(-needed // rows)
        raise DatasetError(
            f"{name}: the run needs {needed} prompts but epochs={epochs} x {rows} rows gives {epochs * rows}; "
            f"set epochs >= {enough}, or leave it unset for as many passes as needed"
        )


def fingerprint(items: list[DatasetItem]) -> str:
    """Short digest of a prompt set's prompts and answers (recorded in the run summary)."""
    text = json.dumps([[item.prompt, item.answer] for item in items], ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
