"""Every reward kind behind one interface (a contract test parametrized over them; the kinds that
judge, rule and model, also score right answers above wrong ones, while the EMULATED kind answers a
declared rate), the model kind's rendering and loading, and its training beating the majority-class
baseline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.agentic.calculator import CalculatorEnv, demonstration
from services.common.config import load_config
from services.reward.protocol import InvalidRequest, RewardRequest, RewardUnavailable
from services.reward.registry import MODEL_META, REWARD_KINDS, check_model_dir

TEST_CONFIG = ["agentic.calculator.max_steps=3"]  # short transcripts: trains in seconds


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A classifier trained on the test config: short transcripts, a smaller model, 200 steps (held-out
    accuracy 0.73 against a majority baseline of 0.51 here, as with 300 steps)."""
    from services.reward.model import ClassifierSpec
    from services.reward.train import TrainSpec, train

    out = tmp_path_factory.mktemp("reward-model")
    small = ClassifierSpec(hidden_size=32, num_heads=2, num_kv_heads=1, intermediate_size=64)
    spec = TrainSpec(steps=200, lr=1e-2, train_examples=2000, eval_examples=600, model=small)
    metrics = train(load_config(None, TEST_CONFIG).agentic, out, spec)
    return out, metrics


def transcript(seed: int, wrong: bool = False) -> RewardRequest:
    env = CalculatorEnv.from_config(load_config(None, TEST_CONFIG).agentic)
    prompt = env.reset(seed).text
    actions = demonstration(env.problem)
    if wrong:
        actions[-1] = f"#{int(actions[-1][1:]) + 3}"
    observations = [env.step(CalculatorEnv.parse_action(a)).observation.text for a in actions]
    return RewardRequest(f"t{seed}", "calculator", seed, prompt, tuple(actions), tuple(observations))


@pytest.fixture(params=["rule", "model", "emulated"])
def reward_fn(request, trained):
    cfg = load_config(None, [*TEST_CONFIG, f"reward.kind={request.param}", f"reward.model_path={trained[0]}"])
    return REWARD_KINDS[request.param](cfg)


def test_contract_of_every_reward_kind(reward_fn):
    assert sorted(REWARD_KINDS.names()) == ["emulated", "model", "rule"] and reward_fn.kind in REWARD_KINDS
    right = [reward_fn.score(transcript(s)) for s in range(30)]
    wrong = [reward_fn.score(transcript(s, wrong=True)) for s in range(30)]
    for scored in right + wrong:
        assert 0.0 <= scored.reward <= 1.0 and isinstance(scored.reward, float)
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in scored.info.items())
    assert [reward_fn.score(transcript(s)).reward for s in range(30)] == [r.reward for r in right]  # deterministic
    if reward_fn.judges:  # right answers score clearly higher (0.2 on average)
        assert sum(r.reward for r in right) >= sum(w.reward for w in wrong) + 6
    else:  # the emulated kind: its declared rate (0.5), whatever the answer
        assert 12 <= sum(r.reward for r in right + wrong) <= 48
    for bad in [RewardRequest("r", "chess", 0, "", (), ()), RewardRequest("x" * 257, "calculator", 0, "", (), ())]:
        with pytest.raises(InvalidRequest):
            reward_fn.score(bad)


def test_training_beats_the_majority_baseline_on_held_out_transcripts(trained):
    path, m = trained
    assert m["held_out"] == 600 and m["held_out_accuracy"] >= m["held_out_majority_baseline"] + 0.1, m
    assert m["train_s"] < 300  # seconds on a loaded 2-core machine; well under a minute on a quiet one
    meta = json.loads((path / MODEL_META).read_text())
    assert meta["tasks"] == ["calculator"] and meta["metrics"]["held_out_accuracy"] == m["held_out_accuracy"]


def test_the_model_kind_scores_only_its_tasks_and_renders_the_context(trained):
    from services.reward.model import ClassifierReward, encode

    fn = ClassifierReward.load(trained[0])
    with pytest.raises(InvalidRequest, match=r"trained on tasks \['calculator'\], not 'walk'"):
        fn.score(RewardRequest("r", "walk", 0, "3,5=", (">>",), ("",)))
    tok = fn.tokenizer
    req = RewardRequest("r", "calculator", 0, "12-3>5=", ("12-3", "#9"), ("=9,", ""))
    ids = encode(tok, req, 64)
    assert tok.decode(ids) == "<bos>12-3>5=12-3<eos>=9,#9<eos>"
    short = encode(tok, req, 6)
    assert short[0] == tok.bos_token_id and short[1:] == ids[-5:]  # <bos> and the tail


def test_a_model_directory_that_does_not_load_is_refused(tmp_path, trained):
    with pytest.raises(RewardUnavailable, match=r"missing config.json, tokenizer.json, reward_meta.json"):
        check_model_dir(str(tmp_path))
    from services.reward.model import ClassifierReward

    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        (tmp_path / name).write_bytes((trained[0] / name).read_bytes())
    (tmp_path / MODEL_META).write_text(json.dumps({"tasks": ["calculator"], "max_tokens": 256, "rendering": "v0"}))
    with pytest.raises(RewardUnavailable, match="rendering 'v0'"):
        ClassifierReward.load(tmp_path)


def test_the_cli_trains_a_loadable_model(tmp_path, capsys):
    from flows.cli import main
    from services.reward.model import ClassifierReward

    config = Path(__file__).resolve().parents[2] / "deploy/configs/smoke.yaml"
    assert main(["reward", "train", "--config", str(config), "--set", TEST_CONFIG[0], "--out", str(tmp_path / "m"),
                 "--steps", "2", "--examples", "60"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["out"] == str(tmp_path / "m") and printed["held_out"] == 20 and printed["train_examples"] == 60
    assert ClassifierReward.load(tmp_path / "m").tasks == ("calculator",)
    assert main(["reward", "train", "--config", str(config), "--set", "agentic.walk.size=1",
                 "--out", str(tmp_path)]) == 2
    assert "agentic.walk.size" in capsys.readouterr().err
