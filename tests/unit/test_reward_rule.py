"""The rule reward on hand-made transcripts: calculator, walk and arith; right and wrong answers,
invalid turns, and inconsistent transcripts rejected naming the turn."""

from __future__ import annotations

import pytest

from services.agentic.calculator import INVALID_OBSERVATION, CalculatorEnv, demonstration
from services.agentic.registry import ENVIRONMENTS
from services.agentic.walk import demonstration as walk_demo
from services.common.config import load_config
from services.reward.protocol import MAX_TEXT_CHARS, InvalidRequest, RewardRequest
from services.reward.rule import RuleReward
from services.tasks.arith import Problem, parse_prompt

AGENTIC = load_config(None, []).agentic
RULE = RuleReward(AGENTIC)


def transcript(task: str, seed: int, actions: list[str], agentic=AGENTIC) -> RewardRequest:
    """A consistent transcript: the actions and what a fresh environment answers to them."""
    env = ENVIRONMENTS[task].from_config(agentic)
    prompt = env.reset(seed).text
    observations = [env.step(ENVIRONMENTS[task].parse_action(a)).observation.text for a in actions]
    return RewardRequest(f"{task}-{seed}", task, seed, prompt, tuple(actions), tuple(observations))


def calc_problem(seed: int):
    env = CalculatorEnv.from_config(AGENTIC)
    env.reset(seed)
    return env.problem


def test_calculator_expert_scores_one_and_a_wrong_answer_zero():
    for seed in range(20):
        turns = demonstration(calc_problem(seed))
        right = RULE.score(transcript("calculator", seed, turns))
        assert right.reward == 1.0 and right.info["correct"] == "true" and right.info["done"] == "true"
        assert right.info["turns"] == str(len(turns)) and right.info["invalid_turns"] == "0"
        wrong = RULE.score(transcript("calculator", seed, [*turns[:-1], f"#{int(turns[-1][1:]) + 1}"]))
        assert wrong.reward == 0.0 and wrong.info["correct"] == "false"


def test_calculator_invalid_turns_and_unfinished_episodes():
    turns = demonstration(calc_problem(5))
    req = transcript("calculator", 5, ["not a call", *turns])
    assert req.observations[0] == INVALID_OBSERVATION
    scored = RULE.score(req)
    assert scored.reward == 1.0 and scored.info["invalid_turns"] == "1"  # the turn is spent, the answer still counts
    unfinished = RULE.score(transcript("calculator", 5, turns[:-1]))  # cut by the turn limit: valid, earns nothing
    assert unfinished.reward == 0.0 and unfinished.info["done"] == "false"
    ended = load_config(None, ["agentic.calculator.invalid_action=end"]).agentic
    first = RuleReward(ended).score(transcript("calculator", 5, ["x"], ended))
    assert first.reward == 0.0 and first.info["done"] == "true" and first.info["event"] == "invalid"


def test_walk_arrival_scores_one():
    env = ENVIRONMENTS["walk"].from_config(AGENTIC)
    env.reset(3)
    turns = walk_demo(env.position, env.target, AGENTIC.walk.max_moves_per_turn)
    assert RULE.score(transcript("walk", 3, turns)).reward == 1.0
    away = ">" if env.target < env.position else "-"
    stuck = RULE.score(transcript("walk", 3, [away, "??"]))
    assert stuck.reward == 0.0 and stuck.info["invalid_turns"] == "1" and stuck.info["done"] == "false"


def test_inconsistent_transcripts_are_rejected_naming_the_turn():
    turns = demonstration(calc_problem(7))
    good = transcript("calculator", 7, turns)
    assert len(turns) >= 2 and good.observations[0] != "=1,"
    bad = RewardRequest("r", "calculator", 7, good.prompt, good.actions, ("=1,", *good.observations[1:]))
    with pytest.raises(InvalidRequest, match=r"^turn 0: the observation '=1,' differs from the environment's"):
        RULE.score(bad)
    with pytest.raises(InvalidRequest, match="is not the first observation of calculator seed 8"):
        RULE.score(RewardRequest("r", "calculator", 8, good.prompt, good.actions, good.observations))
    with pytest.raises(InvalidRequest, match="one observation per action"):
        RULE.score(RewardRequest("r", "calculator", 7, good.prompt, good.actions, good.observations[:-1]))
    after = RewardRequest("r", "calculator", 7, good.prompt, (*good.actions, "1-1"), (*good.observations, "=0,"))
    with pytest.raises(InvalidRequest, match=rf"turn {len(turns)}: the episode ended at turn {len(turns) - 1}"):
        RULE.score(after)


def test_arith_parses_the_prompt_and_reuses_the_task_reward():
    p = Problem("x", 247, 9, 200)
    assert parse_prompt(p.prompt) == Problem("", 247, 9, 200)
    for text in ["", "247-9>200", "200-9>247=", "247-0>200=", "1234567890-1>2=", "a-1>2=", "247-9>200=="]:
        assert parse_prompt(text) is None, text
    right = RULE.score(RewardRequest("a", "arith", 0, p.prompt, ("238,229,220,211,202,193#193",), ()))
    assert right.reward == 1.0 and right.info == {"correct": "true"}
    assert RULE.score(RewardRequest("a", "arith", 0, p.prompt, ("#194",), ("",))).reward == 0.0
    for actions, observations, fragment in [(("#193", "#193"), (), "one action"),
                                            (("#193",), ("=1,",), "no observations")]:
        with pytest.raises(InvalidRequest, match=fragment):
            RULE.score(RewardRequest("a", "arith", 0, p.prompt, actions, observations))
    with pytest.raises(InvalidRequest, match="not a count-down prompt"):
        RULE.score(RewardRequest("a", "arith", 0, "hello", ("#1",), ()))


@pytest.mark.parametrize("change, fragment", [
    (dict(task="chess"), "unknown task 'chess'; served: ['arith', 'calculator', 'walk']"),
    (dict(request_id="x" * 257), "request_id of 257 characters; the limit is 256"),
    (dict(prompt="1" * (MAX_TEXT_CHARS + 1)), "prompt of 4097 characters"),
    (dict(actions=("1" * (MAX_TEXT_CHARS + 1),), observations=("",)), "action 0 of 4097 characters"),
    (dict(actions=("",) * 1025, observations=("",) * 1025), "the limit is 1024 turns"),
])
def test_fields_over_their_limits_are_refused(change, fragment):
    base = dict(request_id="r", task="calculator", seed=0, prompt="", actions=(), observations=())
    with pytest.raises(InvalidRequest, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        RULE.score(RewardRequest(**{**base, **change}))


def test_a_single_turn_completion_may_be_a_whole_long_response_but_not_unbounded():
    from services.reward.protocol import MAX_COMPLETION_CHARS, check_request

    long = "1" * (MAX_TEXT_CHARS + 1)  # e.g. 1,024 tokens of a GSM8K answer: over an environment turn's limit
    check_request(RewardRequest("r", "arith", 0, "1+1=", (long,), ()))
    check_request(RewardRequest("r", "gsm8k", 0, "q", (long,), (), reference="2"), extra_tasks=("gsm8k",))
    with pytest.raises(InvalidRequest, match=f"action 0 of {MAX_COMPLETION_CHARS + 1} characters"):
        check_request(RewardRequest("r", "arith", 0, "1+1=", ("1" * (MAX_COMPLETION_CHARS + 1),), ()))
    with pytest.raises(InvalidRequest, match="action 0 of 4097 characters"):  # an environment's turn: its limit
        check_request(RewardRequest("r", "walk", 0, "", (long,), ("",)))
