"""Ranker datasets: JSONL of (prompt, response length) pairs, validated, and converters into it.

Format (one JSON object per line)::

    {"prompt": "...", "response_length": 412, "id": "optional string"}

``response_length`` is a positive integer in one unit per file: **characters** for data derived
from the MMLU-Pro evaluation outputs (``convert_mmlu``), **tokens** of the policy's tokenizer for
data derived from the SGS generation log (``convert_log``). The ranker learns and predicts in
whatever unit its training file uses; only the order of predictions matters to the dispatcher.

Every reader error names the file, the 1-based line and the field (``DataError``).

Converters:

- ``convert_mmlu``: the MMLU-Pro CoT lengths file (``../shared/data/mmlu-pro-cot``) for one
  target model -> train/val/test JSONL, split 7:2:1 **by prompt** (each question once) with a
  fixed seed. The prompt text is the one the model saw, minus the five few-shot exemplars (not
  in the data file; they are the same five per subject, so they carry no per-prompt signal):
  MMLU-Pro's CoT header naming the subject, then ``Question:``, the lettered options (``N/A``
  padding dropped, as MMLU-Pro's ``preprocess`` does) and ``Answer: Let's think step by step.``
- ``convert_log``: the most recent N finished samples of a ``ranker.genlog.GenerationLog``.
"""

from __future__ import annotations

import gzip
import json
import random
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MMLU_DEFAULT_MODEL = "Meta-Llama-3_1-8B-Instruct"
MMLU_HEADER = (
    "The following are multiple choice questions (with answers) about {category}. Think step by step and "
    'then finish your answer with "the answer is (X)" where X is the correct letter choice.\n'
)
_LETTERS = "ABCDEFGHIJKLMNOP"


class DataError(ValueError):
    """A data file is missing, empty or malformed; the message names the file, line and field."""


@dataclass(frozen=True)
class Example:
    """One (prompt, response length) pair. ``response_length`` > 0, in the file's unit."""

    prompt: str
    response_length: int
    id: str | None = None


@dataclass(frozen=True)
class Dataset:
    examples: tuple[Example, ...]
    source: str = "<memory>"

    @property
    def prompts(self) -> list[str]:
        return [e.prompt for e in self.examples]

    @property
    def lengths(self) -> np.ndarray:
        return np.array([e.response_length for e in self.examples], dtype=np.float64)

    def __len__(self) -> int:
        return len(self.examples)

    def subset(self, idx: Sequence[int]) -> Dataset:
        return Dataset(tuple(self.examples[i] for i in idx), self.source)


def parse_row(obj: object, where: str) -> Example:
    """Validate one decoded JSON row; ``where`` is ``"file:line"`` for the error message."""
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if "prompt" not in obj:
        raise DataError(f"{where}: field 'prompt' is missing")
    prompt = obj["prompt"]
    if not isinstance(prompt, str) or not prompt:
        raise DataError(f"{where}: field 'prompt' must be a non-empty string, got {_short(prompt)}")
    if "response_length" not in obj:
        raise DataError(f"{where}: field 'response_length' is missing")
    length = obj["response_length"]
    if isinstance(length, bool) or not isinstance(length, int):
        raise DataError(f"{where}: field 'response_length' must be an integer, got {_short(length)}")
    if length <= 0:
        raise DataError(f"{where}: field 'response_length' must be > 0, got {length}")
    rid = obj.get("id")
    if rid is not None and not isinstance(rid, (str, int)):
        raise DataError(f"{where}: field 'id' must be a string, got {_short(rid)}")
    return Example(prompt, length, None if rid is None else str(rid))


def _short(v: object) -> str:
    text = json.dumps(v) if not isinstance(v, str) else repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def read_rows(path: str | Path) -> list[tuple[int, dict]]:
    """Raw JSON objects of a JSONL file with their 1-based line numbers (blank lines skipped)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    rows: list[tuple[int, dict]] = []
    opener = gzip.open if path.suffix == ".gz" else open
    lineno = 0
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as err:
                    raise DataError(f"{path}:{lineno}: not valid JSON ({err.msg} at column {err.colno})") from None
                if not isinstance(obj, dict):
                    raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
                rows.append((lineno, obj))
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as err:  # not gzip, truncated, not UTF-8
        raise DataError(f"{path}:{lineno + 1}: unreadable ({type(err).__name__}: {err})") from None
    if not rows:
        raise DataError(f"{path}: empty file (no JSON rows)")
    return rows


def load_prompts(path: str | Path) -> list[tuple[int, dict]]:
    """Rows of a prompts file (for ``annotate``): each needs a non-empty string ``prompt``."""
    rows = read_rows(path)
    for lineno, obj in rows:
        prompt = obj.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            what = "is missing" if "prompt" not in obj else f"must be a non-empty string, got {_short(prompt)}"
            raise DataError(f"{path}:{lineno}: field 'prompt' {what}")
    return rows


def load_dataset(path: str | Path) -> Dataset:
    """Read and validate a ranker JSONL file (``.jsonl`` or ``.jsonl.gz``)."""
    rows = read_rows(path)
    return Dataset(tuple(parse_row(obj, f"{path}:{lineno}") for lineno, obj in rows), str(path))


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> int:
    """Write rows atomically (temp file + rename); returns the row count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    with tmp.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    tmp.replace(path)
    return n


def examples_to_rows(examples: Iterable[Example]) -> list[dict]:
    out = []
    for e in examples:
        row: dict = {"prompt": e.prompt, "response_length": e.response_length}
        if e.id is not None:
            row["id"] = e.id
        out.append(row)
    return out


# --- MMLU-Pro ------------------------------------------------------------------------------------

def mmlu_prompt(category: str, question: str, options: Sequence[str]) -> str:
    """The zero-shot tail of MMLU-Pro's CoT prompt for one question (see the module docstring)."""
    opts = [o for o in options if o != "N/A"]
    lines = "".join(f"{_LETTERS[i]}. {o}\n" for i, o in enumerate(opts))
    return (f"{MMLU_HEADER.format(category=category)}\nQuestion:\n{question}\nOptions:\n{lines}"
            "Answer: Let's think step by step.")


def split_indices(
    n: int, fractions: tuple[float, float, float] = (0.7, 0.2, 0.1), seed: int = 0
) -> tuple[list[int], ...]:
    """Shuffle ``range(n)`` with ``seed`` and cut it by ``fractions`` (train, val, test)."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    a = round(fractions[0] * n)
    b = a + round(fractions[1] * n)
    return order[:a], order[a:b], order[b:]


def convert_mmlu(
    src: str | Path, out_dir: str | Path, model: str = MMLU_DEFAULT_MODEL, seed: int = 0
) -> dict[str, int]:
    """MMLU-Pro lengths file -> ``out_dir/{train,val,test}.jsonl`` (lengths in characters).

    Questions the target model lacks, or answered with an empty response, are dropped.
    Returns the row count per split.
    """
    src = Path(src)
    rows = read_rows(src)
    examples: list[Example] = []
    known: set[str] = set()
    for lineno, obj in rows:
        where = f"{src}:{lineno}"
        for field in ("question_id", "category", "question", "options", "resp_chars"):
            if field not in obj:
                raise DataError(f"{where}: field '{field}' is missing")
        if not isinstance(obj["resp_chars"], dict) or not isinstance(obj["options"], list):
            raise DataError(f"{where}: fields 'resp_chars' (object) and 'options' (list) have the wrong type")
        known.update(obj["resp_chars"])
        length = obj["resp_chars"].get(model)
        if not isinstance(length, int) or length <= 0:
            continue
        prompt = mmlu_prompt(str(obj["category"]), str(obj["question"]), [str(o) for o in obj["options"]])
        examples.append(Example(prompt, length, str(obj["question_id"])))
    if not examples:
        raise DataError(f"{src}: no response lengths for model {model!r}; models in the file: {sorted(known)}")
    parts = split_indices(len(examples), seed=seed)
    out_dir = Path(out_dir)
    counts = {}
    for name, idx in zip(("train", "val", "test"), parts, strict=True):
        counts[name] = write_jsonl(out_dir / f"{name}.jsonl", examples_to_rows(examples[i] for i in idx))
    return counts


# --- generation log ---------------------------------------------------------------------------

def examples_from_log(log_path: str | Path, n: int) -> list[Example]:
    """The ``n`` most recent finished samples of a generation log (lengths in tokens), oldest first."""
    from ranker.genlog import GenerationLog

    log_path = Path(log_path)
    if not log_path.is_file():
        raise DataError(f"{log_path}: no such generation log")
    with GenerationLog(log_path) as log:
        records = log.recent(n)
    return [Example(r.prompt, int(r.response_length), r.prompt_id) for r in records]


def convert_log(log_path: str | Path, out: str | Path, n: int = 10_000) -> int:
    """Generation log -> ranker JSONL (``id`` = the log's prompt_id; lengths in tokens)."""
    examples = examples_from_log(log_path, n)
    if not examples:
        raise DataError(f"{log_path}: the generation log has no finished samples")
    return write_jsonl(out, examples_to_rows(examples))
