"""The tool task: a count-down problem solved through a calculator tool over several turns.

The first observation is the problem's prompt (``services.tasks.arith``), e.g. ``247-9>200=``:
start at 247, subtract 9 while the value is above 200. Each turn the model emits one tool call
or its final answer (the turn ends at EOS); the worker answers a call with its result::

    turn text      meaning                              observation
    247-9          calculator: 247 - 9                  =238,
    238>200        calculator: is 238 > 200? (1 or 0)   =1,
    #193           final answer                         (none: the episode ends)

Operands are 1..9 digits. The reward is rule based: 1.0 for the right final answer, else 0.0.
A turn that does not parse either spends the turn (observation ``=,``) or ends the episode with
reward 0 (``calculator.invalid_action``). Every character used is in the tiny model's ALPHABET
(``0123456789->=,#``), so the task needs no tokenizer change.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from services.agentic.protocol import Action, Environment, EpisodeOver, Observation, StepResult, ToolCall
from services.tasks.arith import ALPHABET, Problem, ProblemSampler

if TYPE_CHECKING:
    from services.common.agentic_config import AgenticConfig, CalculatorEnvConfig

_CALL = re.compile(r"(\d{1,9})([->])(\d{1,9})")
_ANSWER = re.compile(r"#(\d{1,9})")
INVALID_OBSERVATION = "=,"


def evaluate(call: ToolCall) -> int:
    """The calculator: ``a - b``, or ``a > b`` as 1/0."""
    a, op, b = int(call.args[0]), call.args[1], int(call.args[2])
    return a - b if op == "-" else int(a > b)


def demonstration(problem: Problem) -> list[str]:
    """An expert's turns for ``problem``: subtract through the tool until the value is at or below
    the threshold, then answer (the warm start and the tests use it)."""
    turns, x = [], problem.n
    while x > problem.m:
        turns.append(f"{x}-{problem.d}")
        x -= problem.d
    return [*turns, f"#{x}"]


class CalculatorEnv(Environment):
    kind = "calculator"
    alphabet = ALPHABET

    def __init__(self, cfg: CalculatorEnvConfig) -> None:
        self.cfg = cfg
        self.problem: Problem | None = None
        self.done = False

    @classmethod
    def from_config(cls, cfg: AgenticConfig) -> CalculatorEnv:
        return cls(cfg.calculator)

    @classmethod
    def parse_action(cls, text: str) -> Action:
        if m := _CALL.fullmatch(text):
            return Action(text, tool_calls=(ToolCall("calc", m.groups()),))
        if m := _ANSWER.fullmatch(text):
            return Action(text, answer=m.group(1))
        return Action(text, error="expected 'A-B', 'A>B' (A, B of 1..9 digits) or '#N'")

    def reset(self, seed: int) -> Observation:
        sampler = ProblemSampler(seed, **self.cfg.distribution(), prefix=f"s{seed}-")
        self.problem, self.done = sampler.sample(), False
        return Observation(self.problem.prompt)

    def expert(self) -> list[str]:
        if self.problem is None:
            raise EpisodeOver("expert before reset")
        return demonstration(self.problem)

    @property
    def difficulty(self) -> int:
        return self.problem.difficulty if self.problem is not None else 0

    def step(self, action: Action) -> StepResult:
        if self.problem is None or self.done:
            raise EpisodeOver("the episode is over" if self.done else "step before reset")
        if not action.valid:
            self.done = self.cfg.invalid_action == "end"
            return StepResult(Observation("" if self.done else INVALID_OBSERVATION), 0.0, self.done,
                              {"event": "invalid", "error": action.error})
        if action.answer is not None:
            self.done = True
            correct = int(action.answer) == self.problem.answer
            return StepResult(Observation(""), 1.0 if correct else 0.0, True,
                              {"event": "answer", "correct": str(correct).lower()})
        result = evaluate(action.tool_calls[0])
        return StepResult(Observation(f"={result},"), 0.0, False, {"event": "call", "result": str(result)})
