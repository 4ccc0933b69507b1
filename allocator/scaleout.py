"""Dynamic DP scale-out of the SGS: StreamRL §4.2 "Dynamic adjustment" as a pure policy.

Output lengths grow during RL training, and generation time grows faster than training time
(StreamRL Figure 2), so a run balanced at the start drifts into a generation bottleneck. The
trainer cannot be resized without restarting its 3D-parallel runtime, but SGS instances are
decoupled data-parallel (DP) units: one more can join at run time. Each iteration the run
reports its stage times and this policy answers ``out`` / ``in`` / ``hold``.

T_gen of an iteration is its generation time net of overlap with the previous iteration
(``generation_time``): from its first sample's start, or the previous iteration's last finish
if later, to its last finish. With pipelined iterations (``one_step``) and spare instance
capacity, iteration k+1's samples start while k's still run, and the plain first-start to
last-finish span would count the overlap twice; the net time is the generation stage's period
per iteration, the quantity that sets the pipeline's pace against T_train.

Quantities (over a smoothing window of the last ``window`` iterations, see below):

- ``delta = T_gen - T_train``: how far generation lags training (StreamRL's delta);
- ``delta' = T_gen / (n + 1)``: the generation time one more DP unit saves. With ``n`` instances
  at the measured per-instance throughput ``r`` (tokens/s), ``T_gen = W / (n r)`` for the
  iteration's work ``W``; with ``n + 1`` it is ``W / ((n + 1) r)``, so the saving is
  ``T_gen (1 - n / (n + 1)) = T_gen / (n + 1)``. StreamRL computes delta' from its profiler and
  the current workload; we take it from the *measured* T_gen because it already reflects the
  current lengths, batch sizes and this machine (the profile-driven simulator,
  ``allocator/simulator.py``, answers the same question offline but needs a PTL profile fitted
  to the serving hardware). It is optimistic when one long-tail sample bounds T_gen, which a
  new unit cannot shorten; the window and the cooldown keep such an error to one extra unit.
- **scale out** when ``delta >= delta'`` and ``n < max_instances``. Equivalently
  ``T_gen n / (n + 1) >= T_train``: even with the extra unit generation is still not faster than
  training, so the unit is never wasted on making the trainer the bottleneck. StreamRL adds one
  unit per decision (``max_step`` 1, the default). With ``max_step`` k > 1 (a fleet of dozens of
  units, where one unit is a small step) the same rule is applied again to the state it predicts:
  with ``n + j`` units T_gen would be ``T_gen n / (n + j)``, and the (j+1)-th unit is added while
  ``T_gen n / (n + j + 1) >= T_train`` (``units_to_add``), at most k and up to ``max_instances``.
- **scale in** when generation is far ahead: ``T_train - T_gen >= (1 + scale_in_margin) *
  T_gen / (n - 1)`` (the time one fewer unit would add, with a margin against flapping) and
  ``n > min_instances``: without one unit generation would still finish before training.

Smoothing: the policy averages T_gen and T_train over the last ``window`` iterations, and only
iterations observed at the current instance count and more than ``cooldown`` iterations after
the last change count. The cooldown covers the lag between a change and its effect: in
``one_step`` mode the next iteration's prompts were already dispatched when the unit joined.
Until ``window`` such iterations exist the answer is ``hold``.

Pure: plain dataclasses in, a ``ScaleDecision`` out, no I/O and no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Action = Literal["out", "in", "hold"]


@dataclass(frozen=True)
class IterationTiming:
    """One finished iteration: its stage times and the SGS instances serving while it ran."""

    iteration: int
    t_gen_s: float
    t_train_s: float
    instances: int

    @property
    def delta_s(self) -> float:
        return self.t_gen_s - self.t_train_s


@dataclass(frozen=True)
class ScaleoutLimits:
    """The policy's knobs (``ScaleoutConfig`` in ``services/common/config.py`` documents them)."""

    min_instances: int = 1
    max_instances: int = 4
    window: int = 2
    cooldown: int = 2
    scale_in: bool = True
    scale_in_margin: float = 0.25
    max_step: int = 1  # units one decision may add (StreamRL: 1)

    def __post_init__(self) -> None:
        if not 1 <= self.min_instances <= self.max_instances:
            raise ValueError(
                f"need 1 <= min_instances <= max_instances, got {self.min_instances}, {self.max_instances}"
            )
        if self.window < 1 or self.cooldown < 0 or self.scale_in_margin < 0 or self.max_step < 1:
            raise ValueError(f"need window >= 1, cooldown >= 0, scale_in_margin >= 0, max_step >= 1, got {self}")


@dataclass(frozen=True)
class ScaleDecision:
    action: Action
    instances: int  # the instance count after the action
    delta_s: float | None  # mean delta over the window (None: too few iterations yet)
    delta_prime_s: float | None  # the saving of one more unit (out) or the cost of one fewer (in)
    reason: str


def generation_time(first_start: float, last_finish: float, previous_last_finish: float | None) -> float:
    """T_gen of one iteration net of overlap with the previous one (absolute times in seconds)."""
    start = first_start if previous_last_finish is None else max(first_start, previous_last_finish)
    return max(0.0, last_finish - start)


def saved_by_one_more(t_gen_s: float, n: int) -> float:
    """delta': generation time saved by adding one DP unit to ``n`` (ideal DP scaling)."""
    return t_gen_s / (n + 1)


def units_to_add(t_gen_s: float, t_train_s: float, n: int, max_step: int) -> int:
    """Units the scale-out rule adds at once, applied to its own prediction (ideal DP scaling):
    the number of j >= 0, up to ``max_step``, with ``T_gen n / (n + j + 1) >= T_train`` (0 when
    even one unit would make generation faster than training)."""
    k = 0
    while k < max_step and t_gen_s * n / (n + k + 1) >= t_train_s:
        k += 1
    return k


def added_by_one_fewer(t_gen_s: float, n: int) -> float:
    """Generation time added by removing one DP unit from ``n`` > 1 (ideal DP scaling)."""
    return t_gen_s / (n - 1)


def eligible(
    history: Sequence[IterationTiming], current: int, last_change: int | None, cooldown: int
) -> list[IterationTiming]:
    """Iterations that measure the current configuration: at ``current`` instances and more than
    ``cooldown`` iterations after the last change (``last_change`` = its iteration, or None)."""
    after = -1 if last_change is None else last_change + cooldown
    return [t for t in history if t.instances == current and t.iteration > after]


def decide(
    history: Sequence[IterationTiming], current: int, limits: ScaleoutLimits, last_change: int | None = None
) -> ScaleDecision:
    """Scale out, scale in or hold, given the iterations so far (oldest first) and ``current`` instances."""
    if current < 1:
        raise ValueError(f"current instance count must be >= 1, got {current}")
    usable = eligible(history, current, last_change, limits.cooldown)[-limits.window :]
    if len(usable) < limits.window:
        why = ("cooldown" if last_change is not None and history
               and history[-1].iteration <= last_change + limits.cooldown else "warming up")
        return ScaleDecision("hold", current, None, None,
                             f"{why}: {len(usable)}/{limits.window} iterations at {current} instances")
    t_gen = sum(t.t_gen_s for t in usable) / len(usable)
    t_train = sum(t.t_train_s for t in usable) / len(usable)
    delta = t_gen - t_train
    gain = saved_by_one_more(t_gen, current)
    if delta >= gain:
        if current >= limits.max_instances:
            return ScaleDecision("hold", current, delta, gain,
                                 f"delta {delta:.3f}s >= delta' {gain:.3f}s but at max_instances {current}")
        step = max(1, min(units_to_add(t_gen, t_train, current, limits.max_step), limits.max_instances - current))
        return ScaleDecision("out", current + step, delta, gain,
                             f"delta {delta:.3f}s >= delta' {gain:.3f}s" + (f": {step} units" if step > 1 else ""))
    if limits.scale_in and current > limits.min_instances:
        cost = added_by_one_fewer(t_gen, current)
        if -delta >= (1 + limits.scale_in_margin) * cost:
            return ScaleDecision(
                "in", current - 1, delta, cost,
                f"T_train - T_gen {-delta:.3f}s >= (1 + {limits.scale_in_margin}) x {cost:.3f}s added by one "
                "fewer unit",
            )
    return ScaleDecision("hold", current, delta, gain, f"delta {delta:.3f}s < delta' {gain:.3f}s")
