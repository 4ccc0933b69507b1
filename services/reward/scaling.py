"""Elastic scaling of the reward pool (RollArt's serverless reward) as a pure policy.

Reward workers are stateless, so the pool can grow and shrink at run time without moving any
state: a new worker serves as soon as it is in the membership file, and a leaving one is taken
out of it, drained and stopped. What should decide the size is how busy the workers are. Each
worker reports cumulative busy thread-seconds (``busy_s``: injected latency plus scoring) and how
many requests wait for a thread (``queued``); the controller (``flows/reward_pool.py``) polls
them and hands this policy one ``LoadSample`` per poll interval.

Quantities over the window (the newest ``window_s`` seconds of samples, see below):

- utilisation ``u = sum(busy_s) / sum(dt_s x threads x reporting)``: the fraction of the pool's
  scoring threads that were busy (``reporting`` = workers whose counters were read at both ends
  of an interval; a worker being restarted is left out of both sides);
- queueing: whether requests waited for a thread at the end of every interval in the window.

Rule, with ``n`` workers:

- **out** when ``u >= high_utilisation``, or requests waited throughout the window (demand above
  capacity shows as a queue once every thread is busy), and ``n < max_workers``;
- **in** when ``u <= low_utilisation``, nothing waited at any sample of the window, ``n >
  min_workers``, and the same busy time on one fewer worker would stay below the high mark:
  ``u x n / (n - 1) < high_utilisation`` (so a removal never triggers the next addition);
- otherwise **hold**. Outside ``[min_workers, max_workers]`` (a config changed under a running
  pool) the answer moves toward the range first.

Smoothing: the window is the newest samples covering ``window_s``, all at the current size and
starting at least ``cooldown_s`` after the last change (a new worker takes a moment to draw
calls; a removed one's load moves to the others); until such samples cover ``window_s`` the
answer is ``hold``. Pure: plain dataclasses in, a ``PoolDecision`` out, no I/O and no clock (times are the
caller's, in seconds).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Action = Literal["out", "in", "hold"]


@dataclass(frozen=True)
class LoadSample:
    """The pool's load over one poll interval ``(t_s - dt_s, t_s]``."""

    t_s: float  # end of the interval (the caller's clock)
    dt_s: float  # length of the interval
    workers: int  # pool size (membership) during the interval
    reporting: int  # workers whose busy time was read at both ends
    threads: int  # scoring threads per worker
    busy_s: float  # busy thread-seconds in the interval, summed over the reporting workers
    queued: int  # requests waiting for a thread at the end of the interval, summed

    @property
    def capacity_s(self) -> float:
        return self.dt_s * self.threads * self.reporting


@dataclass(frozen=True)
class ScalingLimits:
    """The policy's knobs (``RewardScalingConfig`` in ``services/common/reward_config.py`` documents them)."""

    min_workers: int = 1
    max_workers: int = 4
    high_utilisation: float = 0.75
    low_utilisation: float = 0.25
    window_s: float = 10.0
    cooldown_s: float = 10.0

    def __post_init__(self) -> None:
        if not 1 <= self.min_workers <= self.max_workers:
            raise ValueError(f"need 1 <= min_workers <= max_workers, got {self.min_workers}, {self.max_workers}")
        if not 0 <= self.low_utilisation < self.high_utilisation:
            raise ValueError(
                f"need 0 <= low_utilisation < high_utilisation, got {self.low_utilisation}, {self.high_utilisation}"
            )
        if self.window_s <= 0 or self.cooldown_s < 0:
            raise ValueError(f"need window_s > 0 and cooldown_s >= 0, got {self.window_s}, {self.cooldown_s}")

    @classmethod
    def from_config(cls, sc) -> ScalingLimits:
        return cls(sc.min_workers, sc.max_workers, sc.high_utilisation, sc.low_utilisation, sc.window_s, sc.cooldown_s)


@dataclass(frozen=True)
class PoolDecision:
    action: Action
    workers: int  # the pool size after the action
    utilisation: float | None  # over the window (None: not enough samples yet)
    queued: bool  # requests waited throughout the window
    reason: str


def window(
    history: Sequence[LoadSample], current: int, last_change_s: float | None, limits: ScalingLimits
) -> list[LoadSample]:
    """The newest samples that measure the current size and cover ``window_s`` (fewer when not
    enough exist): at ``current`` workers, starting after the last change plus ``cooldown_s``."""
    settled = -float("inf") if last_change_s is None else last_change_s + limits.cooldown_s
    out: list[LoadSample] = []
    covered = 0.0
    for s in reversed(history):
        if covered >= limits.window_s - 1e-9 or s.workers != current or s.t_s - s.dt_s < settled - 1e-9:
            break
        out.append(s)
        covered += s.dt_s
    return out[::-1]


def utilisation(samples: Sequence[LoadSample]) -> float:
    capacity = sum(s.capacity_s for s in samples)
    return sum(s.busy_s for s in samples) / capacity if capacity > 0 else 0.0


def decide(history: Sequence[LoadSample], current: int, limits: ScalingLimits,
           last_change_s: float | None = None) -> PoolDecision:
    """Scale out, scale in or hold, given the samples so far (oldest first) and ``current`` workers."""
    if current < 1:
        raise ValueError(f"current worker count must be >= 1, got {current}")
    if current < limits.min_workers:
        return PoolDecision("out", current + 1, None, False, f"{current} workers < min_workers {limits.min_workers}")
    if current > limits.max_workers:
        return PoolDecision("in", current - 1, None, False, f"{current} workers > max_workers {limits.max_workers}")
    usable = window(history, current, last_change_s, limits)
    covered = sum(s.dt_s for s in usable)
    if covered < limits.window_s - 1e-9 or not any(s.reporting for s in usable):
        cooling = last_change_s is not None and bool(history) and history[-1].t_s < last_change_s + limits.cooldown_s
        return PoolDecision("hold", current, None, False, f"{'cooldown' if cooling else 'warming up'}: "
                            f"{covered:.1f}s/{limits.window_s}s of load at {current} workers")
    u = utilisation(usable)
    waited = all(s.queued > 0 for s in usable)
    if u >= limits.high_utilisation or waited:
        why = f"utilisation {u:.2f} >= {limits.high_utilisation}" if u >= limits.high_utilisation else \
            f"requests waited throughout {covered:.1f}s (utilisation {u:.2f})"
        if current >= limits.max_workers:
            return PoolDecision("hold", current, u, waited, f"{why} but at max_workers {current}")
        return PoolDecision("out", current + 1, u, waited, why)
    if u <= limits.low_utilisation and not any(s.queued for s in usable) and current > limits.min_workers:
        projected = u * current / (current - 1)
        if projected < limits.high_utilisation:
            return PoolDecision("in", current - 1, u, False, f"utilisation {u:.2f} <= {limits.low_utilisation}; "
                                f"{projected:.2f} on {current - 1} workers")
        return PoolDecision("hold", current, u, False, f"utilisation {u:.2f} is low but {projected:.2f} on "
                            f"{current - 1} workers would reach {limits.high_utilisation}")
    return PoolDecision("hold", current, u, waited, f"utilisation {u:.2f} in ({limits.low_utilisation}, "
                        f"{limits.high_utilisation})")
