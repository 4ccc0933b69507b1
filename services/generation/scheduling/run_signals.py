"""Length estimates from the run itself (issue 55): each prompt's history and its group's finished siblings.

A text ranker sees only the prompt; a GRPO run sees more for free. Every prompt is sampled G times
per visit and, in a run of several epochs, visited again (RhymeRL: the lengths of the previous visit
predict the next), and while a group runs its first finished samples tell how long the rest will
take (Seer: predict the rest of a group from its first finished responses). ``RunLengths`` folds the
three into one estimate, with no I/O:

- **model**: a sample's length ``L`` of prompt ``p``: ``log L = mu_p + sigma * e``, ``e ~ N(0, 1)``;
  ``sigma`` is the within-group spread of log lengths, pooled over the run's closed groups
  (``sigma`` given until ``min_groups`` have closed);
- **prior**: the text ranker's estimate (tokens), shifted in log space by the run's mean error of the
  prior (a ranker off by a factor is corrected as the run goes), worth ``prior_weight`` samples;
  without one, the run's mean log length, worth a hundredth of a sample;
- **history**: the samples of each earlier visit of the same prompt (``identity``: the prompt's text,
  not its per-draw id), each worth ``decay ** a`` samples ``a`` visits later (the policy moves between
  visits, so the recent count more);
- **siblings**: when ``k`` of the group's ``G`` samples have finished they are (about) its ``k``
  shortest, so ``log l_(i) - sigma * z(i, G)`` is an estimate of ``mu_p`` from each, where ``z`` is
  Blom's approximation of the expected normal order statistic; each is worth a sample.

``mu_p`` is the weighted mean of the three (a normal-normal combination with a shared ``sigma``).
Estimates: the mean length of one new sample (``sample``, the lognormal mean, what dispatch books as
work per sample), the expected lengths of a running group's unfinished samples (``remaining``: the
order statistics above the finished ones, never shorter than the longest finished) and the group's
makespan (``makespan``: its expected longest). Lengths are capped at ``max_tokens`` when given.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from statistics import NormalDist

_Z = NormalDist()
NO_PRIOR_WEIGHT = 0.01  # the run's mean log length stands in for a missing prior, worth this many samples


def order_z(i: int, n: int) -> float:
    """Blom's approximation of E[Z_(i:n)], the i-th smallest (1-based) of n standard normals."""
    if not 1 <= i <= n:
        raise ValueError(f"order statistic {i} of {n} is out of range")
    return _Z.inv_cdf((i - 0.375) / (n + 0.25))


@dataclass
class _Group:
    identity: str
    size: int
    prior: float | None  # log tokens, as given (before the run's correction)
    finished: list[float] = field(default_factory=list)  # log lengths, in finishing order


@dataclass
class _History:
    weight: float = 0.0  # samples of earlier visits, decayed
    total: float = 0.0  # their weighted log lengths
    visits: int = 0


class RunLengths:
    """Online per-prompt length estimates from a prior, the prompt's earlier visits and its group's
    finished siblings. ``start`` a group, report each ``finished`` sample, ``close`` it when done (its
    samples become the prompt's history)."""

    def __init__(self, *, decay: float = 0.5, prior_weight: float = 1.0, sigma: float = 0.5,
                 min_groups: int = 8, max_tokens: int | None = None, history: bool = True) -> None:
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"decay must be in [0, 1], got {decay}")
        if prior_weight < 0 or sigma <= 0 or min_groups < 1:
            raise ValueError("prior_weight must be >= 0, sigma > 0 and min_groups >= 1")
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.decay, self.prior_weight, self.sigma0 = decay, prior_weight, sigma
        self.min_groups, self.max_tokens = min_groups, max_tokens
        self.history = history  # False: closed groups teach the spread and the prior's error, not their prompt
        self._groups: dict[str, _Group] = {}
        self._history: dict[str, _History] = {}
        self._ss, self._df, self._closed = 0.0, 0, 0  # pooled within-group spread
        self._sum_log, self._n_log = 0.0, 0  # every finished sample's log length
        self._prior_err, self._n_prior = 0.0, 0  # log actual - log prior, per finished sample with a prior

    # ------------------------------------------------------------------------------------- events
    def start(self, key: str, identity: str, size: int, prior: float | None = None) -> None:
        """Group ``key`` of ``size`` samples of the prompt ``identity`` starts (``prior``: tokens)."""
        if size < 1:
            raise ValueError(f"group size must be >= 1, got {size}")
        if key in self._groups:
            raise ValueError(f"group {key!r} already started")
        self._groups[key] = _Group(identity, size, _log_prior(prior))

    def finished(self, key: str, length: int) -> None:
        """One sample of group ``key`` finished with ``length`` tokens (unknown groups are ignored)."""
        g = self._groups.get(key)
        if g is None or length < 1 or len(g.finished) >= g.size:
            return
        x = math.log(length)
        g.finished.append(x)
        self._sum_log += x
        self._n_log += 1
        if g.prior is not None:
            self._prior_err += x - g.prior
            self._n_prior += 1

    def discard(self, key: str) -> None:
        """Group ``key`` was dropped unfinished: its finished samples (its shortest) are no history."""
        self._groups.pop(key, None)

    def close(self, key: str) -> None:
        """Group ``key`` is done: its finished samples become its prompt's history (``discard`` a dropped one)."""
        g = self._groups.pop(key, None)
        if g is None or not g.finished:
            return
        if self.history:
            h = self._history.setdefault(g.identity, _History())
            h.weight, h.total = h.weight * self.decay + len(g.finished), h.total * self.decay + sum(g.finished)
            h.visits += 1
        if len(g.finished) >= 2:
            mean = sum(g.finished) / len(g.finished)
            self._ss += sum((x - mean) ** 2 for x in g.finished)
            self._df += len(g.finished) - 1
            self._closed += 1

    # ------------------------------------------------------------------------------------ estimates
    @property
    def sigma(self) -> float:
        """The pooled within-group spread of log lengths (the given one until ``min_groups`` closed)."""
        if self._closed < self.min_groups or self._df == 0:
            return self.sigma0
        return max(1e-3, math.sqrt(self._ss / self._df))

    def visits(self, identity: str) -> int:
        h = self._history.get(identity)
        return h.visits if h is not None else 0

    def mu(self, key: str) -> float | None:
        """The log-length location of a running group (None: nothing known yet)."""
        g = self._groups.get(key)
        if g is None:
            raise KeyError(f"group {key!r} is not running")
        return self._mu(g.identity, g.prior, g.finished, g.size)

    def sample(self, identity: str, prior: float | None = None) -> float | None:
        """The mean length of one sample of a new visit of ``identity`` (tokens; None: nothing known)."""
        m = self._mu(identity, _log_prior(prior), [], 1)
        return None if m is None else self._cap(math.exp(m + self.sigma ** 2 / 2))

    def remaining(self, key: str) -> list[float]:
        """Expected lengths of group ``key``'s unfinished samples, shortest first ([] if unknown)."""
        g = self._groups[key]
        m = self.mu(key)
        if m is None:
            return []
        k, s = len(g.finished), self.sigma
        floor = math.exp(max(g.finished)) if g.finished else 0.0
        return [self._cap(max(floor, math.exp(m + s * order_z(i, g.size)))) for i in range(k + 1, g.size + 1)]

    def makespan(self, key: str) -> float | None:
        """The expected length of group ``key``'s longest sample (tokens; None: nothing known)."""
        g = self._groups[key]
        if len(g.finished) == g.size:
            return self._cap(math.exp(max(g.finished)))
        rest = self.remaining(key)
        return rest[-1] if rest else None

    def group_makespan(self, identity: str, size: int, prior: float | None = None) -> float | None:
        """The expected longest of ``size`` samples of a new visit of ``identity`` (tokens)."""
        m = self._mu(identity, _log_prior(prior), [], size)
        return None if m is None else self._cap(math.exp(m + self.sigma * order_z(size, size)))

    # -------------------------------------------------------------------------------------- helpers
    def _mu(self, identity: str, prior: float | None, finished: list[float], size: int) -> float | None:
        weight, total = 0.0, 0.0
        if prior is not None:
            shift = self._prior_err / self._n_prior if self._n_prior else 0.0
            weight, total = self.prior_weight, self.prior_weight * (prior + shift)
        elif self._n_log:
            weight, total = NO_PRIOR_WEIGHT, NO_PRIOR_WEIGHT * self._sum_log / self._n_log
        h = self._history.get(identity)
        if h is not None and h.weight > 0:
            weight, total = weight + h.weight, total + h.total
        s = self.sigma
        for i, x in enumerate(sorted(finished), start=1):
            weight, total = weight + 1.0, total + x - s * order_z(i, size)
        return total / weight if weight > 0 else None

    def _cap(self, tokens: float) -> float:
        return min(tokens, float(self.max_tokens)) if self.max_tokens is not None else tokens


def identity(item) -> str:
    """What makes two draws visits of the same prompt (a task item's per-draw ``prompt_id`` does not):
    its task, system prompt and text."""
    text = f"{item.task}\x00{item.system or ''}\x00{item.prompt}"
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


def _log(tokens: float) -> float:
    return math.log(max(tokens, 1.0))


def _log_prior(prior: float | None) -> float | None:
    """A prior in tokens as a log length; a missing or non-positive one is no prior."""
    return _log(prior) if prior is not None and prior > 0 else None
