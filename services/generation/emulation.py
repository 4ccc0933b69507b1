"""What the emulated engine makes up instead of computing: output lengths, token ids, log-probs.

- ``LengthSampler``: each sample's output length, drawn from a recorded trace (every recorded
  length equally likely) or a declared distribution (``generation.emulation.lengths``). Trace
  files: the mmlu-pro-cot lengths file (``../shared/data/mmlu-pro-cot``, SOURCE.md: response
  characters per model; tokens = characters / ``chars_per_token`` of ``trace_model``), a ranker
  dataset JSONL (``response_length``), an SGS generation log (SQLite: the lengths of its finished
  samples), or a text/JSON file of integers. Errors name the file and what is wrong.
- ``request_rng``: the generator of a seeded request, from its seed and prompt (BLAKE2b, never
  Python's salted ``hash``): the same seed and prompt draw the same length and tokens whatever
  runs beside them.
- ``synthetic_tokens``: SYNTHETIC ids in [0, vocab) that avoid EOS (a sample that stops ends with
  EOS) and log-probs <= 0. They carry no information: emulation measures time, never learning.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import random
from collections.abc import Sequence
from pathlib import Path

from services.common.emulation_config import DeclaredLengths, EmulationConfig

MAX_TRACE_LENGTHS = 1_000_000  # a trace is held in memory; a generation log is read up to this many samples


class TraceError(ValueError):
    """A length trace is missing, empty or malformed; the message names the file and why."""


class LengthSampler:
    """Output lengths (tokens, >= 1) from a trace or a declared distribution."""

    def __init__(self, trace: Sequence[int] | None = None, declared: DeclaredLengths | None = None) -> None:
        if (trace is None) == (declared is None):
            raise ValueError("a length sampler takes a trace or a declared distribution, exactly one")
        if trace is not None and not trace:
            raise ValueError("a length trace needs at least one length")
        self._trace = [max(1, int(x)) for x in trace] if trace is not None else None
        self._declared = declared

    def draw(self, rng: random.Random) -> int:
        if self._trace is not None:
            return self._trace[rng.randrange(len(self._trace))]
        d = self._declared
        assert d is not None
        if d.distribution == "fixed":
            return int(d.tokens)  # type: ignore[arg-type]
        if d.distribution == "uniform":
            return rng.randint(d.low, d.high)  # type: ignore[arg-type]
        return max(1, round(d.median * math.exp(d.sigma * rng.gauss(0.0, 1.0))))  # type: ignore[operator]


def load_lengths(cfg: EmulationConfig) -> LengthSampler:
    """The sampler ``cfg.lengths`` declares; a trace file is read now (``TraceError`` names it)."""
    if isinstance(cfg.lengths, DeclaredLengths):
        return LengthSampler(declared=cfg.lengths)
    return LengthSampler(trace=read_trace(Path(cfg.lengths), cfg.trace_model, cfg.chars_per_token))


def read_trace(path: Path, trace_model: str, chars_per_token: float) -> list[int]:
    """Output lengths in tokens recorded in ``path`` (see the module docstring for the formats)."""
    if not path.is_file():
        raise TraceError(f"length trace {path} does not exist")
    if path.suffix in (".sqlite", ".db"):
        lengths = _genlog_lengths(path)
    elif path.name.endswith((".jsonl", ".jsonl.gz")):
        lengths = _jsonl_lengths(path, trace_model, chars_per_token)
    else:
        lengths = _plain_lengths(path)
    if not lengths:
        raise TraceError(f"length trace {path} holds no lengths")
    return lengths


def _genlog_lengths(path: Path) -> list[int]:
    from ranker.genlog import GenerationLog

    with GenerationLog(path) as log:
        return [int(r.response_length) for r in log.recent(MAX_TRACE_LENGTHS)]


def _jsonl_lengths(path: Path, trace_model: str, chars_per_token: float) -> list[int]:
    opener = gzip.open if path.suffix == ".gz" else open
    lengths: list[int] = []
    with opener(path, "rt") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise TraceError(f"{path}:{lineno}: not JSON: {err.msg}") from None
            if isinstance(obj, dict) and isinstance(obj.get("resp_chars"), dict):  # mmlu-pro-cot
                chars = obj["resp_chars"].get(trace_model)
                if isinstance(chars, int) and chars > 0:
                    lengths.append(max(1, round(chars / chars_per_token)))
            elif isinstance(obj, dict) and isinstance(obj.get("response_length"), int):  # a ranker dataset
                lengths.append(obj["response_length"])
            else:
                raise TraceError(f"{path}:{lineno}: neither resp_chars (mmlu-pro-cot) nor response_length (ranker)")
            if len(lengths) > MAX_TRACE_LENGTHS:
                raise TraceError(f"{path}: more than {MAX_TRACE_LENGTHS} lengths")
    if not lengths:
        raise TraceError(f"{path}: no lengths of model {trace_model!r} (generation.emulation.trace_model)")
    return lengths


def _plain_lengths(path: Path) -> list[int]:
    text = path.read_text()
    try:
        values = json.loads(text) if text.lstrip().startswith("[") else [int(w) for w in text.split()]
    except ValueError as err:
        raise TraceError(f"{path}: not a JSON list or whitespace-separated integers: {err}") from None
    if not all(isinstance(v, int) and v > 0 for v in values):
        raise TraceError(f"{path}: every length must be a positive integer")
    return values


def request_rng(seed: int, prompt: Sequence[int]) -> random.Random:
    """The generator of a request seeded with ``seed``: a function of the seed and the prompt only."""
    h = hashlib.blake2b(digest_size=16)
    h.update(str(seed).encode())
    h.update(b"\0")
    h.update(",".join(map(str, prompt)).encode())
    return random.Random(int.from_bytes(h.digest(), "big"))


def synthetic_tokens(rng: random.Random, n: int, vocab_size: int, eos_ids: Sequence[int],
                     stop: bool) -> tuple[list[int], list[float]]:
    """``n`` SYNTHETIC token ids in [0, vocab_size) and their log-probs (<= 0). No id is EOS except
    the last one when ``stop`` (the sample ended at EOS)."""
    eos = set(eos_ids)
    allowed = [t for t in range(vocab_size) if t not in eos] if vocab_size <= 4096 else None
    tokens: list[int] = []
    for i in range(n):
        if stop and i == n - 1:
            tokens.append(min(eos))
        elif allowed is not None:
            tokens.append(allowed[rng.randrange(len(allowed))])
        else:
            t = rng.randrange(vocab_size)
            while t in eos:
                t = rng.randrange(vocab_size)
            tokens.append(t)
    logprobs = [-rng.expovariate(1.0) for _ in range(n)]
    return tokens, logprobs
