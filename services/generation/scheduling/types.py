"""Plain dataclasses the scheduling policies take and return (no protobuf, no I/O).

Units: lengths and KV sizes are in **tokens** of the served model; times in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SeqRequest:
    """One sequence to generate (a prompt x one sample of its group), as dispatch sees it.

    ``estimate`` is the estimated output length (tokens, or any unit monotone in it: policies
    that need magnitudes calibrate it first, see ``lengths.calibrate``); ``None`` = unknown.
    """

    seq_id: str
    prompt_tokens: int
    estimate: float | None = None
    max_new_tokens: int = 0  # 0 = unknown cap
    group: str = ""  # sequences of one prompt (a GRPO group): their lengths are correlated ("" = on its own)
    count: int = 1  # a unit of ``count`` such sequences that must share an instance (a group dispatched whole)


@dataclass(frozen=True)
class InstanceLoad:
    """What dispatch knows about one instance when a batch arrives (work already on it)."""

    index: int
    outstanding: int = 0  # sequences dispatched to it and not yet returned
    outstanding_work: float = 0.0  # their estimated output tokens
    tokens: float = 0.0  # tokens in flight, measured (KV-resident + queued work; ``least_tokens``)


@dataclass(frozen=True)
class DispatchPlan:
    """Where each sequence goes. ``long_tail``/``long_instances`` are set by skewness-aware
    policies (StreamRL Algorithm 2): the sequences marked long-tail and the instances reserved
    for them. ``predicted_makespan_s`` is the policy's own estimate when it has a cost model."""

    assignment: dict[str, int]
    policy: str
    long_tail: frozenset[str] = frozenset()
    long_instances: tuple[int, ...] = ()
    predicted_makespan_s: float | None = None
    notes: dict[str, float | int | str] = field(default_factory=dict)

    def shares(self, n_instances: int) -> list[list[str]]:
        """Sequence ids per instance, in the order they were assigned."""
        out: list[list[str]] = [[] for _ in range(n_instances)]
        for seq_id, inst in self.assignment.items():
            out[inst].append(seq_id)
        return out
