"""The emulated learner (``trainer.backend: emulated``) and the emulated reward: pure timing and
draws, no model compute, no processes."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from services.common.config import load_config
from services.common.types import SampleRecord
from services.reward.emulated import EmulatedReward
from services.reward.protocol import InvalidRequest, RewardRequest
from services.trainer.emulated import EmulatedLearner, build_time_model
from services.trainer.learner import Group

ROOT = Path(__file__).resolve().parents[2]
EMULATED = ROOT / "deploy/configs/emulated.yaml"


def _sample(prompt: int, response: int) -> SampleRecord:
    return SampleRecord("p", "g", 0, (1,) * prompt, (2,) * response, (0.0,) * response, 0, "stop", 0.0, 0.0, 0.0)


def _learner(overrides: list[str] | None = None) -> tuple[EmulatedLearner, list[float]]:
    slept: list[float] = []
    cfg = load_config(EMULATED, overrides or [])
    policy = SimpleNamespace(model=torch.nn.Linear(3, 2))
    return EmulatedLearner(cfg, policy, "unused: the config names its model", sleep=slept.append), slept


def test_backward_and_step_wait_out_the_allocators_prediction_at_the_time_scale():
    learner, slept = _learner()
    tm, scale = learner.time_model, learner.time_scale
    # the second group's rewards are all equal: no advantage, no KL term, so the real learner skips it
    groups = [Group([_sample(12, n) for n in (100, 400, 900)], [1.0, 0.0, 1.0]),
              Group([_sample(12, 50), _sample(12, 70)], [0.0, 0.0])]
    learner.begin()
    learner.backward(groups)
    learner.backward([])
    assert learner.step() == 0.0
    lengths = [112, 412, 912]
    assert slept == pytest.approx([tm.backward_s(lengths) * scale, tm.step_s() * scale])
    assert learner.stats.trained_samples == 3 and learner.stats.micro_batches == 1
    assert learner.stats.zero_adv_groups == 1
    (step,) = learner.modelled
    assert step.to_json()["predicted_s"] == pytest.approx(tm.backward_s(lengths) + tm.step_s())
    assert step.tokens == sum(lengths) and step.calls == 2
    # longer sequences cost more; a batch of many costs more than one of few
    assert tm.backward_s([2000] * 64) > tm.backward_s([200] * 64) > tm.backward_s([200] * 8) > 0


def test_the_time_model_plans_a_fitting_parallel_config_or_names_the_declared_one():
    tm = build_time_model(load_config(EMULATED), "unused")
    assert tm.parallel.gpus == 8 and tm.describe()["source"].startswith("roofline")
    assert tm.describe()["parallel"] == tm.parallel.label()
    fixed = build_time_model(load_config(EMULATED, ["trainer.emulation.parallel=dp8-tp1-pp1"]), "unused")
    assert (fixed.parallel.dp, fixed.parallel.tp, fixed.parallel.pp) == (8, 1, 1)
    with pytest.raises(ValueError, match=r"uses 4 GPUs, trainer\.emulation\.gpus is 8"):
        build_time_model(load_config(EMULATED, ["trainer.emulation.parallel=dp2-tp2-pp1"]), "unused")
    with pytest.raises(ValueError, match="does not fit on 1 x H20"):
        build_time_model(load_config(EMULATED, ["trainer.emulation={gpu: H20, gpus: 1, model: qwen2.5-72b}"]),
                         "unused")


def test_this_machines_cores_are_timed_by_their_measured_profile():
    tm = build_time_model(load_config(EMULATED, ["trainer.emulation={gpu: cpu-local, gpus: 1, model: braid-tiny}"]),
                          "unused")
    assert "measured profile allocator/profiles/cpu-local-braid-tiny-train.json" in tm.source
    assert tm.step_s() == pytest.approx(tm.site.profile.fixed_s)


def test_the_weights_are_the_runs_own_unchanged_and_the_state_round_trips():
    learner, _ = _learner()
    before = {k: v.clone() for k, v in learner.weights().host_copies().items()}
    for _ in range(2):
        learner.begin()
        learner.backward([Group([_sample(8, 30)], [1.0])])
        learner.step()
    after = learner.weights().host_copies()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    again, _ = _learner()
    again.load_state(learner.state())
    assert [s.to_json() for s in again.modelled] == [s.to_json() for s in learner.modelled]
    assert again.summary()["steps"] == 2 and again.summary()["label"] == "EMULATED"


def _request(i: int, task: str = "arith") -> RewardRequest:
    return RewardRequest(f"r{i}", task, 0, f"{i}+1=", (f"{i % 97} {i}",), ("",))


def test_the_emulated_reward_follows_its_rate_and_is_a_function_of_the_sample():
    n = 4000
    for rate in (0.0, 1.0):
        assert {EmulatedReward(rate).score(_request(i)).reward for i in range(50)} == {rate}
    scored = [EmulatedReward(0.3).score(_request(i)) for i in range(n)]
    share = sum(s.reward for s in scored) / n
    assert abs(share - 0.3) < 4 * (0.3 * 0.7 / n) ** 0.5
    assert all(s.info["emulated"] == "true" and s.info["correct"] == ("true" if s.reward else "false") for s in scored)
    assert [EmulatedReward(0.3).score(_request(i)).reward for i in range(200)] == [s.reward for s in scored[:200]]
    with pytest.raises(InvalidRequest, match="unknown task"):
        EmulatedReward(0.3).score(_request(1, task="nope"))
    with pytest.raises(ValueError, match="probability"):
        EmulatedReward(1.5)


def test_the_emulated_learner_prices_the_groups_the_real_one_trains():
    """The same rule as the real learner (``group_fate``): with a KL term every group is trained;
    with DAPO's dynamic sampling an all-equal group is filtered before anything else."""
    equal = [Group([_sample(12, 40), _sample(12, 60)], [1.0, 1.0])]
    for overrides, trained, zero, filtered in (([], 0, 1, 0), (["trainer.kl_coef=0.01"], 2, 0, 0),
                                               (["trainer.algorithm.dynamic_sampling=true"], 0, 0, 1)):
        learner, _ = _learner(overrides)
        learner.begin()
        learner.backward(equal)
        st = learner.stats
        assert (st.trained_samples, st.zero_adv_groups, st.filtered_groups) == (trained, zero, filtered), overrides
