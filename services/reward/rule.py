"""The rule reward: replay the transcript through a fresh environment; exact and deterministic.

Environment tasks (``services.agentic.ENVIRONMENTS``): build the task's environment from the run
config's ``agentic`` section, ``reset(seed)``, then ``step(parse_action(a))`` for each action.
The reward is the episode's summed reward. The replay also verifies the transcript: the prompt
must be reset's observation and each reported observation the replay's (an environment worker
that answered differently, or a caller that mixed up turns, is caught here), one observation per
action, and no action after the episode ended; a mismatch raises ``InvalidRequest`` naming the
turn. A transcript that stops before the episode ends (the turn or context limit) is valid and
scores what it earned.

The single-turn task ``arith`` (``services.tasks.arith``): the problem is parsed from the prompt
text and the one action (the completion) is scored by the task's own ``reward``. A dataset task
(``task.kind: dataset``; the run's dataset name) is scored by its ``reward.terms``, an evaluation
suite (``eval.suites``; the suite's name) by the suite's own ``terms`` (``services.reward.dataset``).

Info: ``turns``, ``done``, ``invalid_turns`` and the last step's info (the calculator's
``correct``, the walk's ``event``); arith: ``correct``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from services.agentic.registry import ENVIRONMENTS
from services.reward.protocol import InvalidRequest, RewardRequest, Scored, check_request
from services.tasks import arith

if TYPE_CHECKING:
    from services.common.agentic_config import AgenticConfig
    from services.reward.dataset import DatasetReward

_SHOWN = 64  # characters of a text quoted in an error


class RuleReward:
    kind: ClassVar[str] = "rule"
    judges: ClassVar[bool] = True

    def __init__(self, agentic: AgenticConfig, *datasets: DatasetReward) -> None:
        """``datasets``: the rewards of the run's dataset tasks (its training data's, each evaluation
        suite's), each serving its own task names."""
        self.agentic = agentic
        self.by_task: dict[str, DatasetReward] = {task: d for d in datasets for task in d.tasks}
        if len(self.by_task) != sum(len(d.tasks) for d in datasets):
            raise ValueError(f"dataset rewards serve a task name twice: {[d.tasks for d in datasets]}")
        self.extra_tasks: tuple[str, ...] = tuple(self.by_task)

    def score(self, request: RewardRequest) -> Scored:
        check_request(request, self.extra_tasks)
        if request.task in self.by_task:
            return self.by_task[request.task].score(request)
        if request.task == "arith":
            return score_arith(request)
        return self.replay(request)

    def replay(self, request: RewardRequest) -> Scored:
        """The summed reward of the transcript's episode; ``InvalidRequest`` when it is inconsistent."""
        actions, observed = request.actions, request.observations
        if len(actions) != len(observed):
            raise InvalidRequest(f"{len(actions)} actions but {len(observed)} observations: one observation per action")
        kind = ENVIRONMENTS[request.task]
        env = kind.from_config(self.agentic)
        first = env.reset(request.seed).text
        if request.prompt != first:
            raise InvalidRequest(f"the prompt {request.prompt[:_SHOWN]!r} is not the first observation of "
                                 f"{request.task} seed {request.seed} ({first[:_SHOWN]!r})")
        total, done, invalid, last = 0.0, False, 0, {}
        for turn, (action, observation) in enumerate(zip(actions, observed, strict=True)):
            if done:
                raise InvalidRequest(f"turn {turn}: the episode ended at turn {turn - 1}, but the transcript has "
                                     f"{len(actions)} actions")
            result = env.step(kind.parse_action(action))
            if result.observation.text != observation:
                raise InvalidRequest(f"turn {turn}: the observation {observation[:_SHOWN]!r} differs from the "
                                     f"environment's {result.observation.text[:_SHOWN]!r} after action "
                                     f"{action[:_SHOWN]!r}")
            total += result.reward
            done = result.done
            invalid += result.info.get("event") == "invalid"
            last = dict(result.info)
        return Scored(total, {**last, "turns": str(len(actions)), "done": str(done).lower(),
                              "invalid_turns": str(invalid)})


def score_arith(request: RewardRequest) -> Scored:
    """The single-turn count-down task: the completion's final answer against the prompt's problem."""
    problem = arith.parse_prompt(request.prompt)
    if problem is None:
        raise InvalidRequest(f"arith prompt {request.prompt[:_SHOWN]!r} is not a count-down prompt 'N-D>M=' "
                             "(1..9-digit numbers, D >= 1, N > M)")
    if len(request.actions) != 1:
        raise InvalidRequest(f"arith is single-turn: one action (the completion), not {len(request.actions)}")
    if len(request.observations) > 1 or any(request.observations):
        raise InvalidRequest("arith has no observations: send none, or one empty string")
    reward = arith.reward(problem, request.actions[0])
    return Scored(reward, {"correct": str(reward == 1.0).lower()})
