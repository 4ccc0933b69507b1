"""The reward interface: a finished trajectory's text in, a score out; pure.

A ``RewardRequest`` carries everything needed to judge one trajectory without any state on the
worker (the task, the episode seed, the prompt, each turn's action text and the observation the
environment returned after it), so any worker can score any request and a failed call can be
retried on another. A ``RewardFunction`` of one kind (``registry.REWARD_KINDS``) turns a request
into a ``Scored`` (reward and info); the worker adds who scored it and how long it took
(``RewardResult``). A request that cannot be scored raises ``InvalidRequest`` (the service
answers INVALID_ARGUMENT with its message).

Limits (checked by ``check_request`` before any kind sees the request): ids up to 256
characters, prompt, action, observation and reference texts up to 4096 characters each (the
environment worker's limit), but a single-turn task's completion (arith, a dataset task) up to
``MAX_COMPLETION_CHARS`` (a whole response: 1,024 tokens of a long answer are more than 4096
characters), up to 1024 turns, a dataset row's JSON up to 64 KiB.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from services.agentic.protocol import MAX_ACTION_CHARS
from services.agentic.registry import ENVIRONMENTS
from services.common.task_config import MAX_ROW_JSON_CHARS

MAX_ID_CHARS = 256
MAX_TEXT_CHARS = MAX_ACTION_CHARS  # a prompt, action or observation: the environment worker's limit
MAX_COMPLETION_CHARS = 1 << 20  # a single-turn task's one completion (<= 4 MB of UTF-8: the service's 16 MB frame)
MAX_TURNS = 1024  # agentic.max_turns' bound
SINGLE_TURN_TASKS = ("arith",)  # services.tasks.arith: one completion, no environment


def tasks() -> list[str]:
    """Every task a reward request may name: the environment kinds and the single-turn tasks."""
    return sorted([*ENVIRONMENTS.names(), *SINGLE_TURN_TASKS])


@dataclass(frozen=True)
class RewardRequest:
    request_id: str  # e.g. the trajectory id (<= 256 characters)
    task: str  # an environment kind ("calculator", "walk") or a single-turn task ("arith")
    seed: int  # the episode seed (environment tasks); ignored for arith
    prompt: str  # the first observation (arith: the prompt, e.g. "247-9>200=")
    actions: tuple[str, ...]  # each turn's action text, EOS excluded (arith: one element, the completion)
    observations: tuple[str, ...]  # the observation after each action ("" when none)
    reference: str = ""  # dataset tasks: the row's reference answer
    row_json: str = ""  # dataset tasks: the whole row as a JSON object (your own reward functions get it as a dict)


@dataclass(frozen=True)
class Scored:
    """What a reward function answers: the reward and why."""

    reward: float
    info: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RewardResult:
    reward: float
    kind: str  # "rule" | "model"
    info: Mapping[str, str]  # e.g. {"correct": "true"} or why a transcript was rejected
    worker: str  # id of the worker that scored it
    score_s: float  # wall time on the worker


class InvalidRequest(ValueError):
    """A request that cannot be scored (bad field, unknown task, inconsistent transcript)."""


class RewardFunction(Protocol):
    """One reward kind. ``score`` is deterministic, thread-safe and raises only ``InvalidRequest``
    for the caller's mistakes (anything else is a bug of the worker)."""

    kind: ClassVar[str]
    judges: ClassVar[bool]  # whether the reward depends on the answer (False: the EMULATED kind's declared rate)

    def score(self, request: RewardRequest) -> Scored: ...


def check_request(request: RewardRequest, extra_tasks: Sequence[str] = ()) -> None:
    """Raise ``InvalidRequest`` for an unknown task (``extra_tasks``: a run's dataset tasks, served
    besides the built-in ones) or a field over its limit."""
    served = [*tasks(), *extra_tasks]
    if request.task not in served:
        raise InvalidRequest(f"unknown task {request.task[:64]!r}; served: {served}")
    if len(request.request_id) > MAX_ID_CHARS:
        raise InvalidRequest(f"request_id of {len(request.request_id)} characters; the limit is {MAX_ID_CHARS}")
    if len(request.actions) > MAX_TURNS or len(request.observations) > MAX_TURNS:
        raise InvalidRequest(
            f"{len(request.actions)} actions and {len(request.observations)} observations; the limit is "
            f"{MAX_TURNS} turns"
        )
    if len(request.row_json) > MAX_ROW_JSON_CHARS:
        raise InvalidRequest(f"row_json of {len(request.row_json)} characters; the limit is {MAX_ROW_JSON_CHARS}")
    single_turn = request.task in SINGLE_TURN_TASKS or request.task in extra_tasks
    action_limit = MAX_COMPLETION_CHARS if single_turn else MAX_TEXT_CHARS
    texts = [("prompt", request.prompt, MAX_TEXT_CHARS), ("reference", request.reference, MAX_TEXT_CHARS)]
    texts += [(f"action {k}", a, action_limit) for k, a in enumerate(request.actions)]
    texts += [(f"observation {k}", o, MAX_TEXT_CHARS) for k, o in enumerate(request.observations)]
    for name, text, limit in texts:
        if len(text) > limit:
            raise InvalidRequest(f"{name} of {len(text)} characters; the limit is {limit}")


class RewardUnavailable(RuntimeError):
    """A reward kind cannot be built from this config (e.g. no loadable model): the worker refuses to start."""
