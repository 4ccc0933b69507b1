"""The agentic environments as pure objects: action parsing, dynamics, rewards, alphabets, config."""

from __future__ import annotations

import random
import re

import pytest

from services.agentic.calculator import INVALID_OBSERVATION, CalculatorEnv, demonstration
from services.agentic.protocol import EpisodeOver
from services.agentic.registry import ENVIRONMENTS
from services.agentic.walk import WalkEnv
from services.agentic.walk import demonstration as walk_demo
from services.common.config import ConfigError, load_config
from services.tasks.arith import ALPHABET


def cfg(*overrides: str):
    return load_config(None, list(overrides)).agentic


@pytest.mark.parametrize("text, calls, answer", [
    ("247-9", (("247", "-", "9"),), None), ("238>200", (("238", ">", "200"),), None), ("#193", (), "193"),
    ("007-1", (("007", "-", "1"),), None),
])
def test_calculator_parses_calls_and_answers(text, calls, answer):
    action = CalculatorEnv.parse_action(text)
    assert action.valid and tuple(c.args for c in action.tool_calls) == calls and action.answer == answer


@pytest.mark.parametrize("text", ["", "247", "247-", "-9", "247-9-1", "#", "#-3", "1234567890-1", "247-9,", "247 - 9",
                                  "#1#2", "2>", "\x00", "é-1"])
def test_calculator_refuses_what_does_not_parse_without_raising(text):
    action = CalculatorEnv.parse_action(text)
    assert not action.valid and "expected" in action.error


def test_calculator_expert_is_rewarded_and_answers_come_from_the_tool():
    for seed in range(50):
        env = CalculatorEnv.from_config(cfg())
        prompt = env.reset(seed).text
        assert prompt == env.problem.prompt
        turns = demonstration(env.problem)
        for text in turns[:-1]:
            r = env.step(CalculatorEnv.parse_action(text))
            a, b = text.split("-")
            assert r.observation.text == f"={int(a) - int(b)}," and r.reward == 0.0 and not r.done
        last = env.step(CalculatorEnv.parse_action(turns[-1]))
        assert last.done and last.reward == 1.0 and last.observation.text == ""
        with pytest.raises(EpisodeOver):
            env.step(CalculatorEnv.parse_action("1-1"))


def test_calculator_wrong_answer_comparison_and_invalid_turns():
    env = CalculatorEnv.from_config(cfg())
    env.reset(7)
    assert env.step(CalculatorEnv.parse_action("238>200")).observation.text == "=1,"
    assert env.step(CalculatorEnv.parse_action("3-5")).observation.text == "=-2,"
    bad = env.step(CalculatorEnv.parse_action("x"))
    assert bad.observation.text == INVALID_OBSERVATION and not bad.done and bad.info["event"] == "invalid"
    wrong = env.step(CalculatorEnv.parse_action(f"#{env.problem.answer + 1}"))
    assert wrong.done and wrong.reward == 0.0
    ender = CalculatorEnv.from_config(cfg("agentic.calculator.invalid_action=end"))
    ender.reset(7)
    r = ender.step(CalculatorEnv.parse_action("??"))
    assert r.done and r.reward == 0.0 and r.observation.text == ""


def test_resets_are_fixed_by_the_seed():
    for kind in ENVIRONMENTS.names():
        a, b = ENVIRONMENTS[kind].from_config(cfg()), ENVIRONMENTS[kind].from_config(cfg())
        assert [a.reset(s).text for s in range(20)] == [b.reset(s).text for s in range(20)]
        assert len({a.reset(s).text for s in range(20)}) > 5


def test_walk_moves_clamp_at_walls_and_reward_arrival():
    env = WalkEnv.from_config(cfg("agentic.walk.size=5", "agentic.walk.max_moves_per_turn=3"))
    env.reset(0)
    env.position, env.target = 1, 4
    r = env.step(WalkEnv.parse_action("---"))  # one move, then two into the wall
    assert r.observation.text == "0,4=" and env.position == 0 and not r.done
    r = env.step(WalkEnv.parse_action(">>>"))
    assert r.observation.text == "3,4=" and r.reward == 0.0
    r = env.step(WalkEnv.parse_action(">>-"))  # arrives on the first move: the rest are dropped
    assert r.done and r.reward == 1.0 and env.position == 4


def test_walk_refuses_too_many_moves_and_bad_text():
    env = WalkEnv.from_config(cfg("agentic.walk.max_moves_per_turn=2"))
    first = env.reset(3).text
    for text in (">>>", "", "<", ">x", "#1"):
        r = env.step(WalkEnv.parse_action(text))
        assert r.observation.text == first and not r.done and r.info["event"] == "invalid", text
    ender = WalkEnv.from_config(cfg("agentic.walk.invalid_action=end"))
    ender.reset(3)
    assert ender.step(WalkEnv.parse_action("?")).done


def test_walk_expert_arrives_in_the_fewest_turns():
    c = cfg("agentic.walk.size=30", "agentic.walk.max_moves_per_turn=4")
    for seed in range(30):
        env = WalkEnv.from_config(c)
        env.reset(seed)
        turns = walk_demo(env.position, env.target, 4)
        assert len(turns) == -(-abs(env.target - env.position) // 4)
        results = [env.step(WalkEnv.parse_action(t)) for t in turns]
        assert results[-1].done and results[-1].reward == 1.0 and not any(r.done for r in results[:-1])


def test_random_text_never_raises_and_observations_stay_in_the_alphabet():
    rng = random.Random(0)
    chars = ALPHABET + "abc <>é\n"
    for kind in ENVIRONMENTS.names():
        cls = ENVIRONMENTS[kind]
        assert set(cls.alphabet) <= set(ALPHABET), kind  # the tiny model's tokenizer covers every observation
        for seed in range(40):
            env = cls.from_config(cfg())
            texts = [env.reset(seed).text]
            for _ in range(6):
                r = env.step(cls.parse_action("".join(rng.choice(chars) for _ in range(rng.randint(0, 8)))))
                texts.append(r.observation.text)
                if r.done:
                    break
            assert all(set(t) <= set(ALPHABET) for t in texts), texts


def test_the_tiny_tokenizer_encodes_observations_without_unknown_tokens():
    from services.policy.model import char_tokenizer

    tok = char_tokenizer()
    env = CalculatorEnv.from_config(cfg())
    texts = [env.reset(1).text, "=-12,", INVALID_OBSERVATION, "4,9="]
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.unk_token_id not in ids and len(ids) == len(text)


def test_config_is_off_by_default_and_refuses_bad_values():
    c = cfg()
    assert not c.enabled and c.latency.kind == "none"
    for override, fragment in [
        ("agentic.redundant_trajectories=-1",
         "agentic.redundant_trajectories: Input should be greater than or equal to 0"),
        ("agentic.max_turns=0", "agentic.max_turns: Input should be greater than or equal to 1"),
        ("agentic.latency.kind=gamma", "agentic.latency.kind: Input should be 'none', 'fixed' or 'normal'"),
        ("agentic.latency.std_s=1", "applies only to kind 'normal'"),
        ("agentic.step_timeout_s=0", "agentic.step_timeout_s: Input should be greater than 0"),
        ("agentic.max_context_tokens=16", "must be < max_context_tokens"),
    ]:
        with pytest.raises(ConfigError) as err:
            load_config(None, [override])
        assert fragment in str(err.value), (override, str(err.value))
    from flows.registries import check_registries

    with pytest.raises(ConfigError, match=re.escape("unknown environment kind 'chess'; "
                                                    "registered: ['calculator', 'walk']")):
        # the schema knows no registry: checked when a run is prepared
        check_registries(load_config(None, ["agentic.env=chess"]))
