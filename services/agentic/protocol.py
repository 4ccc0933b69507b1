"""The environment protocol: typed observations, actions parsed from generated text, step results.

An environment is a pure, seeded state machine over text: ``reset(seed)`` returns the first
observation (the prompt), ``step(action)`` applies one parsed action and returns the next
observation, a reward and whether the episode is over. Environments never see tokens: the
EnvManager tokenizes each observation alone and appends it to the running context, so generated
tokens are never re-tokenized (verl #6719's token drift cannot happen). Each kind declares the
characters its observations use, so a config can check them against the policy's tokenizer.

Actions are the text of one turn (EOS excluded), parsed by the environment kind's own pure
``parse_action`` into tool calls or a final answer; text that does not parse is an ``Action``
with ``error`` set, never an exception.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from services.common.agentic_config import AgenticConfig

MAX_ACTION_CHARS = 4096  # a turn's text longer than this is refused at the worker's edge


@dataclass(frozen=True)
class Observation:
    """What the environment shows the policy: text appended to the context as-is."""

    text: str


@dataclass(frozen=True)
class ToolCall:
    """One tool invocation parsed from a turn, e.g. ``calc`` with args ``("247", "-", "9")``."""

    name: str
    args: tuple[str, ...]


@dataclass(frozen=True)
class Action:
    """A parsed turn: tool calls, a final answer, or (``error`` set) text that did not parse."""

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    answer: str | None = None
    error: str = ""

    @property
    def valid(self) -> bool:
        return not self.error


@dataclass(frozen=True)
class StepResult:
    observation: Observation
    reward: float
    done: bool
    info: Mapping[str, str] = field(default_factory=dict)


class Environment(ABC):
    """One episode's state. Subclasses are registered by kind (``registry.ENVIRONMENTS``) and
    built from the ``AgenticConfig`` by ``from_config``; ``reset`` must be called before ``step``."""

    kind: ClassVar[str]
    alphabet: ClassVar[str]  # every character an observation may contain

    @classmethod
    @abstractmethod
    def from_config(cls, cfg: AgenticConfig) -> Environment:
        """A fresh environment of this kind, its options read from its section of ``cfg``."""

    @classmethod
    @abstractmethod
    def parse_action(cls, text: str) -> Action:
        """Parse one turn's text (pure; never raises on any string)."""

    @abstractmethod
    def reset(self, seed: int) -> Observation:
        """Start an episode fixed by ``seed``; return the first observation."""

    @abstractmethod
    def step(self, action: Action) -> StepResult:
        """Apply one action. Raises ``EpisodeOver`` after the episode ended."""

    @abstractmethod
    def expert(self) -> list[str]:
        """An expert's action texts for the episode just reset (the warm start's demonstrations)."""

    @property
    def difficulty(self) -> int:
        """How hard the episode just reset is (the evaluation's breakdown); 0 when the kind has no measure."""
        return 0

    # Whether held-out evaluation episodes are kept out of training by their first observation.
    # False for kinds with few distinct episodes (every one is also a training episode).
    held_out_by_observation: ClassVar[bool] = True


class EpisodeOver(RuntimeError):
    """A step after the episode ended (or before reset)."""


@dataclass(frozen=True)
class StepOutcome:
    """A step as the worker reports it: the result plus the session's turn count and timings."""

    observation: str
    reward: float
    done: bool
    info: Mapping[str, str]
    turn: int  # steps applied after this one
    latency_s: float = 0.0  # injected delay
    step_s: float = 0.0  # wall time on the worker, delay included
