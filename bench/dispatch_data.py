"""Inputs of ``bench/dispatch.py``: the ranker's estimates file and the workloads built from it.

Estimates file: JSONL, one object per line with ``prompt`` (string), ``response_length``
(positive int: the true length), ``estimated_length`` (positive number: the ranker's
estimate, any unit monotone in length) and optional ``id`` — what ``braid ranker annotate``
writes. Lengths are converted to tokens with ``chars_per_token`` (MMLU-Pro lengths are in
characters; tokens ~ chars / 4); ``--length-unit tokens`` takes them as tokens.

Workloads (regimes):

- ``one``  — 1024 distinct prompts, one sample each (one round: 128 per instance on 8);
- ``multi`` — 512 prompts x 8 samples (a GRPO batch of 4096). The data hold one response per
  prompt, so the 8 samples of a prompt share its length (a simplification: sampled responses
  of one prompt vary in length, which would make prediction harder and balancing easier);
- ``short`` — lengths as in the data; ``long`` — lengths scaled so the longest is 20K tokens
  (StreamRL's 20K set).

The rows not drawn into the batch are the "recent history": their (estimate, length) pairs
give the router's recent length distribution D and the estimator's error model, as the live
router would have them from the previous iterations. The batch's own lengths are never shown
to the scheduler except in oracle runs.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

LONG_CAP_TOKENS = 20_000
ONE_ROUND_SAMPLES = 1024
MULTI_PROMPTS, GROUP = 512, 8


class EstimatesError(ValueError):
    """The estimates file is missing, empty or malformed; the message names file, line and field."""


@dataclass(frozen=True)
class Row:
    prompt: str
    response_length: float
    estimated_length: float
    id: str


def load_estimates(path: str | Path) -> list[Row]:
    path = Path(path)
    if not path.is_file():
        raise EstimatesError(f"{path}: no such estimates file")
    rows: list[Row] = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise EstimatesError(f"{path}: line {n}: not JSON ({err.msg})") from None
        if not isinstance(obj, dict):
            raise EstimatesError(f"{path}: line {n}: expected an object")
        if not isinstance(obj.get("prompt"), str):
            raise EstimatesError(f"{path}: line {n}: field 'prompt' must be a string")
        for field in ("response_length", "estimated_length"):
            v = obj.get(field)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise EstimatesError(f"{path}: line {n}: field {field!r} must be a positive number, got {v!r}")
        rows.append(Row(obj["prompt"], float(obj["response_length"]), float(obj["estimated_length"]),
                        str(obj.get("id", n))))
    if len(rows) < 2 * MULTI_PROMPTS // 4:
        raise EstimatesError(f"{path}: {len(rows)} rows; the benchmark needs at least {2 * MULTI_PROMPTS // 4}")
    return rows


def ranker_quality(rows: list[Row]) -> dict[str, float]:
    """Recall of the longest 20/10/5% and Spearman of the estimates in the file (context for the results)."""
    from scipy.stats import spearmanr

    order_true = sorted(range(len(rows)), key=lambda i: -rows[i].response_length)
    order_est = sorted(range(len(rows)), key=lambda i: -rows[i].estimated_length)
    out = {}
    for pct in (20, 10, 5):
        k = max(1, len(rows) * pct // 100)
        out[f"recall_at_{pct}"] = len(set(order_true[:k]) & set(order_est[:k])) / k
    out["spearman"] = float(spearmanr([r.response_length for r in rows], [r.estimated_length for r in rows]).statistic)
    out["n"] = len(rows)
    return out


@dataclass
class Workload:
    name: str
    prompt_tokens: list[int]
    lengths: list[int]  # true output tokens, per sample
    estimates: list[float]  # ranker estimates, per sample
    groups: list[str]  # the prompt each sample belongs to
    history: list[tuple[float, float]]  # (estimate, true tokens) of rows outside the batch


def build_workload(rows: list[Row], lengths: str, rounds: str, *, chars_per_token: float, seed: int) -> Workload:
    """``lengths``: short | long; ``rounds``: one | multi (see the module docstring)."""
    tokens = [max(1.0, r.response_length / chars_per_token) for r in rows]
    scale = LONG_CAP_TOKENS / max(tokens) if lengths == "long" else 1.0
    rng = random.Random(seed)
    order = list(range(len(rows)))
    rng.shuffle(order)
    if rounds == "one":
        n, group = min(ONE_ROUND_SAMPLES, len(rows) - len(rows) // 8), 1
    else:
        n, group = min(MULTI_PROMPTS, len(rows) - len(rows) // 8), GROUP
    batch, rest = order[:n], order[n:]
    true = [max(1, round(t * scale)) for t in tokens]
    return Workload(
        name=f"{lengths}-{rounds}",
        prompt_tokens=[max(1, round(len(rows[i].prompt) / chars_per_token)) for i in batch for _ in range(group)],
        lengths=[true[i] for i in batch for _ in range(group)],
        estimates=[rows[i].estimated_length for i in batch for _ in range(group)],
        groups=[f"p{i}" for i in batch for _ in range(group)],
        history=[(rows[i].estimated_length, float(true[i])) for i in rest],
    )


def with_synthetic_estimates(w: Workload, sigma: float, seed: int) -> Workload:
    """The workload with the ranker's estimates replaced by ``true length x exp(sigma z)``,
    z ~ N(0, 1), one draw per prompt (its samples share it) and per history row: a ranker of
    chosen quality (sigma 0 = the true lengths), to ask how good estimates must be to pay."""
    import dataclasses

    if sigma < 0:
        raise ValueError(f"sigma must be >= 0, got {sigma}")
    rng = random.Random(seed * 7919 + 17)
    noise: dict[str, float] = {}
    estimates = [t * noise.setdefault(g, math.exp(sigma * rng.gauss(0.0, 1.0)))
                 for t, g in zip(w.lengths, w.groups, strict=True)]
    history = [(a * math.exp(sigma * rng.gauss(0.0, 1.0)), a) for _, a in w.history]
    return dataclasses.replace(w, name=f"{w.name}~{sigma:g}", estimates=estimates, history=history)
