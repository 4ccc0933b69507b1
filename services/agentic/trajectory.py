"""Multi-turn trajectories as token sequences: what the EnvManager builds and a trainer consumes.

A trajectory is one running token context: the first observation's tokens (the prompt), then per
turn the tokens the SGS generated (exactly as returned, EOS included when the turn ended there)
followed by the next observation's tokens, tokenized alone. ``loss_mask`` is 1 on generated
tokens and 0 on prompt and observation tokens; ``logprobs`` is aligned with ``token_ids`` (the
SGS's sampling log-prob on generated tokens, 0.0 elsewhere). Nothing is ever re-tokenized: the
builder only appends id sequences it is given. Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

Status = Literal["done", "max_turns", "context"]  # env ended it / turn limit / context budget


@dataclass(frozen=True)
class Turn:
    index: int
    action_text: str
    gen_start: int  # offset of the turn's generated tokens in token_ids
    gen_len: int
    obs_len: int  # observation tokens appended after them
    weight_version: int
    finish_reason: str  # the SGS's: "stop" (EOS) or "length"
    reward: float
    info: Mapping[str, str] = field(default_factory=dict)
    retries: int = 0  # failed env step attempts before the one that succeeded
    gen_s: float = 0.0
    env_s: float = 0.0  # step wall time seen by the manager, retries and latency included
    latency_s: float = 0.0  # injected environment latency reported by the worker
    observation: str = ""  # the environment's text after this turn (tokenized alone into obs_len tokens)


@dataclass(frozen=True)
class Trajectory:
    trajectory_id: str
    env_kind: str
    seed: int
    token_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    prompt_len: int
    turns: tuple[Turn, ...]
    reward: float
    status: Status
    started_at: float
    finished_at: float
    prompt_text: str = ""  # the first observation (tokenized into the first prompt_len tokens)
    # earlier segments of an agent's episode (services.gateway: history edits), trained beside it
    segments: tuple[Trajectory, ...] = ()

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def weight_versions(self) -> tuple[int, ...]:
        return tuple(t.weight_version for t in self.turns)

    @property
    def generated_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def gen_s(self) -> float:
        return sum(t.gen_s for t in self.turns)

    @property
    def env_s(self) -> float:
        return sum(t.env_s for t in self.turns)


@dataclass(frozen=True)
class Dropped:
    """A trajectory given up after environment failures: counted, never silently lost."""

    trajectory_id: str
    env_kind: str
    seed: int
    turns_done: int
    reason: str
    code: str  # the last failure's status name (or TIMEOUT)
    generated_tokens: int = 0  # work lost with it


class TrajectoryBuilder:
    """Appends prompt, generated and observation id sequences, keeping mask and log-probs aligned."""

    def __init__(self, prompt_ids: Sequence[int]) -> None:
        if not prompt_ids:
            raise ValueError("a trajectory needs a non-empty prompt")
        self.token_ids: list[int] = list(prompt_ids)
        self.loss_mask: list[int] = [0] * len(prompt_ids)
        self.logprobs: list[float] = [0.0] * len(prompt_ids)
        self.prompt_len = len(prompt_ids)

    def __len__(self) -> int:
        return len(self.token_ids)

    def context(self) -> tuple[int, ...]:
        return tuple(self.token_ids)

    def add_generated(self, ids: Sequence[int], logprobs: Sequence[float]) -> int:
        """Append one turn's generated tokens; return their offset."""
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} generated tokens but {len(logprobs)} log-probs")
        start = len(self.token_ids)
        self.token_ids.extend(ids)
        self.loss_mask.extend([1] * len(ids))
        self.logprobs.extend(float(lp) for lp in logprobs)
        return start

    def add_observation(self, ids: Sequence[int]) -> None:
        self.token_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))

    def build(self, *, trajectory_id: str, env_kind: str, seed: int, turns: Sequence[Turn], status: Status,
              started_at: float, finished_at: float, prompt_text: str = "") -> Trajectory:
        assert len(self.token_ids) == len(self.loss_mask) == len(self.logprobs)
        return Trajectory(
            trajectory_id, env_kind, seed, tuple(self.token_ids), tuple(self.loss_mask), tuple(self.logprobs),
            self.prompt_len, tuple(turns), sum(t.reward for t in turns), status, started_at, finished_at, prompt_text,
        )
