"""Output-length bookkeeping for dispatch: recent lengths, the ranker's error, calibration.

A ranker is trained to *order* prompts by output length (StreamRL §5.2); its raw scores need
not be calibrated tokens. Policies that add lengths up (global LPT's "least estimated work",
Algorithm 2's latency model) therefore map estimates onto the recent output-length
distribution D by rank (quantile mapping): the sequence with the q-th quantile estimate gets
the q-th quantile of D. Order is preserved, magnitudes become realistic, and a ranker that
only ranks well still balances load well. Without D the raw estimates are used as they are.

Quantile mapping trusts the ranker's order completely. When recent (estimate, actual) pairs
are known — the router sees both for every finished sample — ``EstimateErrorModel`` learns
how far to trust it: the actual lengths of past samples whose estimate ranked near a new
estimate form its conditional distribution. ``expected`` (the conditional mean) is then the
calibration (a perfect ranker gives back the actual lengths, a useless one gives everyone
the overall mean), and ``scenarios`` draws plausible true lengths for a whole batch, which the
refined dispatch uses to judge a plan against the ranker's real mistakes.

Unknown estimates (``None``) are filled with the median of D (or of the known estimates):
dispatch treats an unknown prompt as a typical one.
"""

from __future__ import annotations

import bisect
import random
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Protocol


class LengthDistribution:
    """An immutable, sorted sample of output lengths (tokens) with quantiles."""

    def __init__(self, lengths: Iterable[float]) -> None:
        values = sorted(float(x) for x in lengths)
        if not values:
            raise ValueError("a length distribution needs at least one length")
        if values[0] < 0:
            raise ValueError(f"lengths must be >= 0, got {values[0]}")
        self._values = values

    def __len__(self) -> int:
        return len(self._values)

    def quantile(self, q: float) -> float:
        """Linear-interpolated quantile, ``q`` in [0, 1]."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be in [0, 1], got {q}")
        v = self._values
        pos = q * (len(v) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(v) - 1)
        return v[lo] + (v[hi] - v[lo]) * (pos - lo)

    @property
    def p50(self) -> float:
        return self.quantile(0.5)

    @property
    def p90(self) -> float:
        return self.quantile(0.9)

    def mean(self) -> float:
        return sum(self._values) / len(self._values)

    def rank_of(self, x: float) -> float:
        """Fraction of the sample <= x."""
        return bisect.bisect_right(self._values, x) / len(self._values)


class LengthEstimator(Protocol):
    """What dispatch needs of a ranker: estimated output lengths for prompt texts."""

    def predict(self, prompts: list[str]) -> Sequence[float]: ...


class LengthWindow:
    """The most recent ``size`` finished lengths (the "recent distribution" of Algorithm 2)."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"window size must be >= 1, got {size}")
        self._window: deque[float] = deque(maxlen=size)

    def add(self, length: float) -> None:
        self._window.append(float(length))

    def __len__(self) -> int:
        return len(self._window)

    def distribution(self, min_samples: int = 1) -> LengthDistribution | None:
        """The window as a distribution, or ``None`` below ``min_samples`` lengths."""
        if len(self._window) < max(1, min_samples):
            return None
        return LengthDistribution(self._window)


class EstimateErrorModel:
    """Actual lengths conditioned on the estimate's rank, learned from (estimate, actual) pairs.

    For a new estimate ``e`` the *pool* is the past pairs whose estimates are the nearest in
    rank to ``e``: ``bandwidth`` of the history (at least ``min_pool`` pairs). Its actual
    lengths are the conditional distribution of the true length given ``e``.
    """

    def __init__(self, pairs: Sequence[tuple[float, float]], bandwidth: float = 0.1, min_pool: int = 8) -> None:
        if len(pairs) < 2:
            raise ValueError(f"an estimate error model needs at least 2 (estimate, actual) pairs, got {len(pairs)}")
        if not 0.0 < bandwidth <= 1.0:
            raise ValueError(f"bandwidth must be in (0, 1], got {bandwidth}")
        ordered = sorted((float(e), float(a)) for e, a in pairs)
        self._est = [e for e, _ in ordered]
        self._act = [a for _, a in ordered]
        self._prefix = [0.0]
        for a in self._act:
            self._prefix.append(self._prefix[-1] + a)
        self._half = max(min_pool, int(bandwidth * len(ordered))) // 2

    def __len__(self) -> int:
        return len(self._est)

    def _pool(self, e: float) -> tuple[int, int]:
        n = len(self._est)
        lo_i, hi_i = bisect.bisect_left(self._est, e), bisect.bisect_right(self._est, e)
        centre = (lo_i + hi_i) // 2
        size = min(n, 2 * self._half + 1)
        lo = min(max(0, centre - self._half), n - size)
        return lo, lo + size

    def expected(self, e: float) -> float:
        """Mean actual length of the pool around ``e``."""
        lo, hi = self._pool(e)
        return (self._prefix[hi] - self._prefix[lo]) / (hi - lo)

    def scenarios(self, estimates: Sequence[float], k: int, seed: int) -> list[list[float]]:
        """``k`` draws of true lengths for a batch: each sequence independently from its pool."""
        rng = random.Random(seed)
        pools = [self._pool(e) for e in estimates]
        return [[self._act[rng.randrange(lo, hi)] for lo, hi in pools] for _ in range(k)]


def calibrate(
    estimates: Sequence[float | None], dist: LengthDistribution | None, errors: EstimateErrorModel | None = None
) -> list[float]:
    """Estimates as expected lengths. With ``errors``: the conditional mean of each estimate's
    pool; else with ``dist``: quantile mapping onto ``dist`` (ties keep their mean rank); else
    the estimates unchanged. Unknowns get the median of ``dist`` (or of the known values; 1.0
    when nothing is known, so every sequence weighs the same)."""
    known = [(e, i) for i, e in enumerate(estimates) if e is not None]
    out: list[float] = [0.0] * len(estimates)
    if errors is not None:
        for e, i in known:
            out[i] = errors.expected(e)
        values = [out[i] for _, i in known]
        fill = dist.p50 if dist is not None else (_median(values) if values else 1.0)
        for i, e in enumerate(estimates):
            if e is None:
                out[i] = fill
        return out
    if dist is None:
        fill = _median([e for e, _ in known]) if known else 1.0
        for i, e in enumerate(estimates):
            out[i] = float(e) if e is not None else fill
        return out
    known.sort()
    n = len(known)
    j = 0
    while j < n:  # groups of equal estimates share the quantile of their mean rank
        k = j
        while k + 1 < n and known[k + 1][0] == known[j][0]:
            k += 1
        q = ((j + k) / 2 + 0.5) / n
        value = dist.quantile(min(1.0, max(0.0, q)))
        for _, i in known[j : k + 1]:
            out[i] = value
        j = k + 1
    median = dist.p50
    for i, e in enumerate(estimates):
        if e is None:
            out[i] = median
    return out


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    m = len(s) // 2
    return float(s[m]) if len(s) % 2 else (s[m - 1] + s[m]) / 2.0
