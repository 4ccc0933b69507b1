"""The forgetting check and the evaluation schedule (pure: plain numbers in, a verdict out).

A suite is **forgotten** when its accuracy now falls below its warm-start accuracy by more than
``threshold_se`` standard errors of the difference. Both are binomial proportions over the same
prompts (one sample each, seeded by ``eval.seed``); the standard error of the difference is taken
as if they were independent, ``sqrt(se_before^2 + se_now^2)``, which is conservative for paired
answers (agreement between the two evaluations only shrinks the true one), so a flag means a real
drop. A drop whose standard error is 0 (both accuracies 0 or 1) is flagged whenever it is
positive. The check is a warning (``eval.forgetting_se``); ``eval.stop_on_forgetting`` makes the
trainer end the run at the first evaluation that flags a suite.

``due`` is the schedule: a suite with ``every`` N is scored after each N-th optimizer step before
the last one (the warm start and the end are scored for every suite anyway).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Score:
    """One evaluation of one suite: accuracy over ``prompts`` samples and its binomial standard error."""

    accuracy: float
    stderr: float
    prompts: int


@dataclass(frozen=True)
class Forgetting:
    """A flagged suite: its warm-start and current accuracy, the standard error of their difference,
    the drop in those standard errors, and the weight version judged."""

    suite: str
    before: float
    now: float
    stderr: float
    drop_in_stderr: float
    weight_version: int

    def to_json(self) -> dict:
        return asdict(self)


def flag_line(flag: dict) -> str:
    """One line of a flag (``Forgetting.to_json()``) for the trainer's log, the flow's log and the report."""
    return (f"FORGETTING: suite {flag['suite']} fell from {flag['before']:.3f} to {flag['now']:.3f} at weight "
            f"version {flag['weight_version']} ({flag['drop_in_stderr']:.1f} standard errors of the difference, "
            f"s.e. {flag['stderr']:.3f})")


def drop_stderr(before: Score, now: Score) -> float:
    """The standard error of ``before.accuracy - now.accuracy`` (independent binomials)."""
    return math.sqrt(before.stderr ** 2 + now.stderr ** 2)


def judge(suite: str, before: Score, now: Score, threshold_se: float, version: int) -> Forgetting | None:
    """The flag when ``now`` fell below ``before`` by more than ``threshold_se`` standard errors, else None."""
    if threshold_se <= 0:
        raise ValueError(f"threshold_se must be > 0, got {threshold_se}")
    drop = before.accuracy - now.accuracy
    if drop <= 0:
        return None
    se = drop_stderr(before, now)
    in_se = drop / se if se > 0 else math.inf
    if in_se <= threshold_se:
        return None
    return Forgetting(suite, before.accuracy, now.accuracy, se, in_se, version)


def judge_all(before: dict[str, Score], now: dict[str, Score], threshold_se: float,
              version: int) -> list[Forgetting]:
    """The flags of every suite scored ``now`` (in its order) against its warm start in ``before``."""
    missing = sorted(set(now) - set(before))
    if missing:
        raise ValueError(f"suites {missing} have no warm-start evaluation to compare with")
    flags = (judge(name, before[name], score, threshold_se, version) for name, score in now.items())
    return [f for f in flags if f is not None]


def due(every: int, version: int, last: int) -> bool:
    """Whether a suite scored every ``every`` steps (0 = never between) is due after the step to
    ``version``, the run ending at ``last`` (whose final evaluation scores every suite)."""
    if every < 0 or version < 0:
        raise ValueError(f"every and version must be >= 0, got {every} and {version}")
    return every > 0 and 0 < version < last and version % every == 0
