"""Forced-length replay of recorded output lengths (``forced_length_replay``).

A workload whose long tail is a real one: every GRPO group is generated with
``PromptSpec.forced_length`` (the SGS submits it with EOS ignored, ``services.generation.core``)
set to a length drawn for its prompt from a list of recorded response lengths in tokens. All
samples of a group share the length (one Generate call per group carries one forced length).

The draw is a hash of (seed, prompt id) into the list, not a random stream: the same prompt gets
the same length in every run with the same seed, whatever order groups are launched in, so two
variants of a benchmark run (repack on and off) replay the same lengths on the same prompts.

With ``estimates`` the replay also stands in for the length estimator: ``"recorded"`` gives each
group the estimate recorded beside its length (a file of ``{"length", "estimate"}`` objects: real
lengths and a real ranker's estimates of them, e.g. ``bench/results/ranker_test_estimates.jsonl``
converted), ``"oracle"`` its true length; the dispatch policy then places groups on them.

``scale_to_cap`` maps lengths recorded under one token budget onto a smaller one linearly (the
source's cap onto ours), so the shape of the distribution (p99/p50, the top-20% share) and the
share of responses that ran to the cap are kept.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


def scale_to_cap(recorded: Sequence[float], source_cap: float, cap: int) -> list[int]:
    """``recorded`` lengths (tokens under a budget of ``source_cap``) scaled by ``cap / source_cap``,
    rounded, clipped to [1, ``cap``]: a response that ran to the source's cap runs to ``cap``."""
    if source_cap <= 0 or cap < 1:
        raise ValueError(f"source_cap must be > 0 and cap >= 1, got {source_cap} and {cap}")
    factor = cap / source_cap
    return [max(1, min(cap, round(x * factor))) for x in recorded]


def summary(lengths: Sequence[int], cap: int) -> dict:
    """Mean, quantiles (linear interpolation), max, the share at ``cap`` and the top-20% token share."""
    from services.generation.scheduling.lengths import LengthDistribution

    d = LengthDistribution(lengths)
    ordered = sorted(lengths)
    top = ordered[len(ordered) - max(1, len(ordered) // 5):]
    return {"n": len(lengths), "mean": statistics.fmean(lengths), "p50": d.quantile(0.5), "p90": d.quantile(0.9),
            "p99": d.quantile(0.99), "max": ordered[-1], "cap": cap,
            "at_cap": sum(1 for x in lengths if x >= cap) / len(lengths), "top20_token_share": sum(top) / sum(ordered)}


ESTIMATES = ("none", "recorded", "oracle")


@dataclass(frozen=True)
class ReplayLengths:
    """A list of output lengths (tokens), the seed of the per-prompt draw, and where a group's
    length estimate comes from (``mode``: ``ESTIMATES``; ``estimates`` beside the lengths)."""

    lengths: tuple[int, ...]
    seed: int = 0
    mode: str = "none"
    estimates: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if not self.lengths:
            raise ValueError("forced-length replay needs at least one length")
        bad = [x for x in self.lengths if isinstance(x, bool) or not isinstance(x, int) or x < 1]
        if bad:
            raise ValueError(f"replay lengths must be integers >= 1, got {bad[:5]}")
        if self.mode not in ESTIMATES:
            raise ValueError(f"replay estimates must be one of {ESTIMATES}, got {self.mode!r}")
        if self.mode == "recorded" and self.estimates is None:
            raise ValueError('replay estimates "recorded" need a file of {"length", "estimate"} objects')
        if self.estimates is not None and (len(self.estimates) != len(self.lengths)
                                           or any(not x > 0 for x in self.estimates)):
            raise ValueError("replay estimates must be one positive number per length")

    @classmethod
    def load(cls, path: str | Path, cap: int, seed: int = 0, mode: str = "none") -> ReplayLengths:
        """The JSON list in ``path`` — of lengths, or of ``{"length", "estimate"}`` objects; every
        length must lie in [1, ``cap``]."""
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"forced_length_replay.file {path}: no such file")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"forced_length_replay.file {path}: not JSON ({err.msg})") from None
        if not isinstance(data, list):
            raise ValueError(f"forced_length_replay.file {path}: expected a JSON list of token lengths")
        try:
            lengths, estimates = _columns(data)
            replay = cls(lengths, seed, mode, estimates)
        except ValueError as err:
            raise ValueError(f"forced_length_replay.file {path}: {err}") from None
        if max(replay.lengths) > cap:
            raise ValueError(f"forced_length_replay.file {path}: length {max(replay.lengths)} exceeds "
                             f"generation.max_new_tokens ({cap})")
        return replay

    def _row(self, prompt_id: str) -> int:
        digest = hashlib.blake2b(f"{self.seed}\x00{prompt_id}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") % len(self.lengths)

    def length(self, prompt_id: str) -> int:
        """The forced length of ``prompt_id``'s group."""
        return self.lengths[self._row(prompt_id)]

    def forced(self, problem, samples: int) -> tuple[int, tuple[int, ...]]:
        """The draw's forced length (one for every sample; no per-sample lengths)."""
        return self.length(problem.prompt_id), ()

    def estimate_for(self, problem, samples: int) -> float | None:
        return self.estimate(problem.prompt_id)

    def estimate(self, prompt_id: str) -> float | None:
        """The length estimate of ``prompt_id``'s group under ``mode`` (None for ``"none"``)."""
        if self.mode == "oracle":
            return float(self.length(prompt_id))
        if self.mode == "recorded":
            return self.estimates[self._row(prompt_id)]
        return None


def _columns(data: list) -> tuple[tuple, tuple[float, ...] | None]:
    """(lengths, estimates or None) of a replay file's list: of lengths, or of objects."""
    if not data or not isinstance(data[0], dict):
        return tuple(data), None
    if not all(isinstance(r, dict) and "length" in r and "estimate" in r for r in data):
        raise ValueError('expected every entry to be a {"length", "estimate"} object (or every one a length)')
    estimates = [r["estimate"] for r in data]
    if any(isinstance(x, bool) or not isinstance(x, int | float) for x in estimates):
        raise ValueError(
            f"estimates must be numbers, got {[x for x in estimates if not isinstance(x, int | float)][:5]}"
        )
    return tuple(r["length"] for r in data), tuple(float(x) for x in estimates)


class VisitReplay:
    """A recorded multi-visit trace replayed sample by sample (issue 55; ``bench/run_signals_trace.py``):
    a file of groups ``{"prompt", "visit", "lengths"}`` (gzipped JSON lines, lengths in finishing
    order). The k-th draw of a prompt in a run replays the k-th recorded visit of the same prompt
    text (cycling past the last), one forced length per sample, so a run sees what the recorded run
    saw: each prompt's lengths moving from visit to visit, and the spread within a group. A group of
    fewer samples than recorded takes a fixed subset (a hash of the draw, in finishing order); a
    prompt that is not in the trace is an error (the run's task must be the trace's prompts).
    Estimates: ``oracle`` (the draw's mean length), ``recorded`` (each group's ``estimate``: a text
    ranker's estimate of the prompt, written beside the lengths, e.g. ``bench/fleet_run_signals.py``'s
    cross-fitted prior) or ``none``."""

    def __init__(self, visits: dict[str, list[tuple[int, ...]]], mode: str = "none",
                 estimates: dict[str, float] | None = None) -> None:
        if not visits:
            raise ValueError("a visit trace needs at least one group")
        if mode not in ("none", "oracle", "recorded"):
            raise ValueError(f"a visit trace's estimates are none, recorded or oracle, got {mode!r}")
        if mode == "recorded" and (estimates is None or set(estimates) != set(visits)):
            raise ValueError("forced_length_replay.estimates=recorded: the trace records no estimate for every prompt "
                             "(an \"estimate\" beside each group's lengths)")
        self.visits, self.mode, self.estimates = visits, mode, estimates or {}
        self._draws: dict[str, tuple[str, int]] = {}  # prompt id -> (prompt text, the draw's visit)
        self._seen: dict[str, int] = {}  # prompt text -> draws so far

    @classmethod
    def load(cls, path: str | Path, cap: int, mode: str = "none") -> VisitReplay:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"forced_length_replay.file {path}: no such file")
        rows: dict[str, list[tuple[int, tuple[int, ...]]]] = {}
        estimates: dict[str, float] = {}
        with gzip.open(path, "rt") as fh:
            for n, line in enumerate(fh):
                if not line.strip():
                    continue
                r = json.loads(line)
                if not isinstance(r, dict):
                    r = {}
                lengths = r.get("lengths")
                if (not isinstance(r.get("prompt"), str) or not isinstance(r.get("visit"), int) or not lengths
                        or any(isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= cap for x in lengths)):
                    raise ValueError(f"forced_length_replay.file {path}: line {n + 1} is not a group of lengths in "
                                     f"[1, {cap}] (generation.max_new_tokens)")
                rows.setdefault(r["prompt"], []).append((r["visit"], tuple(lengths)))
                est = r.get("estimate")
                if est is not None:
                    if isinstance(est, bool) or not isinstance(est, (int, float)) or not est > 0:
                        raise ValueError(f"forced_length_replay.file {path}: line {n + 1}'s estimate must be a "
                                         "positive number")
                    estimates[r["prompt"]] = float(est)
        return cls({p: [ls for _, ls in sorted(v)] for p, v in rows.items()}, mode, estimates)

    def _draw(self, problem) -> tuple[str, int]:
        if problem.prompt_id not in self._draws:
            if problem.prompt not in self.visits:
                raise ValueError(f"prompt {problem.prompt_id!r} is not in the replayed trace (its task must be the "
                                 "trace's prompts)")
            k = self._seen.get(problem.prompt, 0)
            self._seen[problem.prompt] = k + 1
            self._draws[problem.prompt_id] = (problem.prompt, k)
        return self._draws[problem.prompt_id]

    def lengths(self, problem, samples: int) -> tuple[int, ...]:
        """The forced length of each of the draw's ``samples`` samples."""
        text, k = self._draw(problem)
        recorded = self.visits[text][k % len(self.visits[text])]
        if samples > len(recorded):
            raise ValueError(f"a group of {samples} samples, but the trace recorded {len(recorded)} a visit")
        if samples == len(recorded):
            return recorded
        seed = int.from_bytes(hashlib.blake2b(problem.prompt_id.encode(), digest_size=8).digest(), "big")
        keep = sorted(random.Random(seed).sample(range(len(recorded)), samples))
        return tuple(recorded[i] for i in keep)

    def forced(self, problem, samples: int) -> tuple[int, tuple[int, ...]]:
        return 0, self.lengths(problem, samples)

    def estimate_for(self, problem, samples: int) -> float | None:
        """``oracle``: the draw's mean length (each sample's expected work); ``recorded``: the prompt's
        recorded estimate; ``none``: None."""
        if self.mode == "recorded":
            return self.estimates[self._draw(problem)[0]]
        if self.mode != "oracle":
            return None
        lengths = self.lengths(problem, samples)
        return sum(lengths) / len(lengths)


def load_replay(replay, cap: int) -> ReplayLengths | VisitReplay | None:
    """The run's forced-length replay (``forced_length_replay``): a list of lengths (JSON), or a
    multi-visit trace (``.jsonl.gz``); None when off."""
    if not replay.file:
        return None
    if str(replay.file).endswith(".jsonl.gz"):
        return VisitReplay.load(replay.file, cap, replay.estimates)
    return ReplayLengths.load(replay.file, cap, replay.seed, replay.estimates)
