"""The stateful text game: walk along a line of cells to a target, a few moves per turn.

Cells are ``0..size-1``. The observation is ``P,T=`` (at cell P, target T). A turn is 1 to
``max_moves_per_turn`` moves, ``>`` (one cell right) or ``-`` (one cell left); a move into a wall
is spent in place, so the state (not only the prompt) decides what an action does. The episode
ends with reward 1.0 the moment the walker stands on the target (remaining moves of that turn
are dropped). A turn that does not parse spends the turn (the same observation comes back) or
ends the episode with reward 0 (``walk.invalid_action``). The characters used (digits ``,=>-``)
are all in the tiny model's ALPHABET.
"""

from __future__ import annotations

import random
import re
from typing import TYPE_CHECKING

from services.agentic.protocol import Action, Environment, EpisodeOver, Observation, StepResult, ToolCall

if TYPE_CHECKING:
    from services.common.agentic_config import AgenticConfig, WalkEnvConfig

_MOVES = re.compile(r"[->]+")
MAX_PARSE_MOVES = 64  # the config's bound on moves per turn


def observe(position: int, target: int) -> str:
    return f"{position},{target}="


def demonstration(position: int, target: int, max_moves: int) -> list[str]:
    """An expert's turns: full turns of moves toward the target."""
    step = ">" if target > position else "-"
    distance = abs(target - position)
    return [step * min(max_moves, distance - i) for i in range(0, distance, max_moves)]


class WalkEnv(Environment):
    kind = "walk"
    alphabet = "0123456789,="

    def __init__(self, cfg: WalkEnvConfig) -> None:
        self.cfg = cfg
        self.position = self.target = -1
        self.done = True
        self._started = False

    @classmethod
    def from_config(cls, cfg: AgenticConfig) -> WalkEnv:
        return cls(cfg.walk)

    @classmethod
    def parse_action(cls, text: str) -> Action:
        if _MOVES.fullmatch(text) and len(text) <= MAX_PARSE_MOVES:
            return Action(text, tool_calls=(ToolCall("move", tuple(text)),))
        return Action(text, error=f"expected 1..{MAX_PARSE_MOVES} moves, each '>' (right) or '-' (left)")

    def reset(self, seed: int) -> Observation:
        rng = random.Random(seed)
        self.position, self.target = rng.sample(range(self.cfg.size), 2)
        self.done, self._started = False, True
        return Observation(observe(self.position, self.target))

    held_out_by_observation = False  # size x (size - 1) episodes: evaluation episodes are training episodes too

    def expert(self) -> list[str]:
        if not self._started:
            raise EpisodeOver("expert before reset")
        return demonstration(self.position, self.target, self.cfg.max_moves_per_turn)

    @property
    def difficulty(self) -> int:
        return abs(self.target - self.position) if self._started else 0

    def step(self, action: Action) -> StepResult:
        if not self._started or self.done:
            raise EpisodeOver("the episode is over" if self._started else "step before reset")
        moves = action.tool_calls[0].args if action.valid else ()
        if not action.valid or len(moves) > self.cfg.max_moves_per_turn:
            error = action.error or f"{len(moves)} moves; at most {self.cfg.max_moves_per_turn} per turn"
            return self._invalid(error)
        for move in moves:
            self.position = min(self.cfg.size - 1, max(0, self.position + (1 if move == ">" else -1)))
            if self.position == self.target:
                self.done = True
                return StepResult(Observation(""), 1.0, True, {"event": "arrived", "position": str(self.position)})
        return StepResult(Observation(observe(self.position, self.target)), 0.0, False,
                          {"event": "moved", "position": str(self.position)})

    def _invalid(self, error: str) -> StepResult:
        self.done = self.cfg.invalid_action == "end"
        text = "" if self.done else observe(self.position, self.target)
        return StepResult(Observation(text), 0.0, self.done, {"event": "invalid", "error": error})
