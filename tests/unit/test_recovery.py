"""Recovery checkpoints: atomic write, selection, pruning; the data cursor; versions on the wire."""

from __future__ import annotations

import pytest

from services.common.trainer_config import TrainerConfig
from services.common.types import GenerateParams, SampleRecord
from services.rollout.pools import PromptPool
from services.run import recovery
from services.run.resume import ShiftedClient
from services.tasks.arith import ProblemSampler


def test_save_is_atomic_and_the_newest_complete_checkpoint_is_chosen(tmp_path):
    root = tmp_path / "recovery"
    recovery.save_atomic(root, 2, {"x": 2})
    recovery.save_atomic(root, 4, {"x": 4})
    (root / ".tmp-v00006-123").mkdir()  # a save a kill interrupted: never read
    (root / "v00008").mkdir()  # no state: not complete
    (root / "notes").mkdir()
    found = recovery.newest(root)
    assert found.version == 4 and recovery.load(found) == {"x": 4}
    recovery.save_atomic(root, 6, {"x": 6})
    assert not (root / ".tmp-v00006-123").exists()  # cleaned by the next save
    assert [f.version for f in recovery.complete(root)] == [2, 4, 6]
    assert [p.name for p in recovery.prune(root, 2)] == ["v00002"]
    assert [f.version for f in recovery.complete(root)] == [4, 6]


def test_no_checkpoint_and_a_mismatched_meta_file(tmp_path):
    assert recovery.newest(tmp_path / "missing") is None
    path = recovery.save_atomic(tmp_path, 3, {})
    path.rename(tmp_path / "v00005")
    with pytest.raises(ValueError, match=r"meta.json says version 3"):
        recovery.load(recovery.newest(tmp_path))


def test_the_sampler_cursor_draws_the_same_problems_again():
    sampler = ProblemSampler(7)
    sampler.batch(5)
    cursor = sampler.state()
    ahead = sampler.batch(4)
    sampler.restore(cursor)
    assert sampler.batch(4) == ahead


def test_the_prompt_pool_queue_and_the_sampler_restore_the_hand_out_order():
    sampler = ProblemSampler(3)
    pool = PromptPool.from_batches(sampler.batch, 4)
    first = [pool.take() for _ in range(3)]
    pool.put_back(first[1])
    queued, cursor = pool.queued(), sampler.state()
    expected = [pool.take() for _ in range(7)]
    fresh = ProblemSampler(3)
    fresh.restore(cursor)
    restored = PromptPool.from_batches(fresh.batch, 4, queued=queued)
    assert [restored.take() for _ in range(7)] == expected
    assert expected[0] == first[1] and len(queued) == 2


def test_recovery_config_defaults_and_errors():
    rc = TrainerConfig().recovery
    assert (rc.every, rc.keep, rc.max_restarts) == (10, 2, 3)
    for bad in ({"keep": 0}, {"every": -1}, {"max_restarts": -1}, {"evry": 3}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            TrainerConfig(recovery=bad)


class _FakeClient:
    address = "fake:1"

    def __init__(self) -> None:
        self.params: list[GenerateParams] = []

    def generate(self, prompts, params):
        self.params.append(params)
        yield SampleRecord("p", "p", 0, (1,), (2,), (0.0,), params.min_weight_version, "stop", 0.0, 0.0, 0.0)

    def health(self):
        from services.common.types import HealthSnapshot

        return HealthSnapshot("serving", 12, -1, 0, 0, 0, 0.0, "hf", 0)


def test_a_shifted_client_asks_for_wire_versions_and_reports_trainer_versions():
    inner = _FakeClient()
    client = ShiftedClient(inner, 7)
    (sample,) = client.generate([], GenerateParams(1, 0, 3))
    assert inner.params[0].min_weight_version == 10 and sample.weight_version == 3 and client.address == "fake:1"
    health = client.health()
    assert (health.weight_version, health.pending_version) == (5, -1)


def _orchestrator_state(sampler: ProblemSampler, version: int = 0):
    from collections import Counter
    from types import SimpleNamespace

    from services.rollout.pools import ExperienceBuffer
    from services.rollout.staleness import StalenessManager

    return SimpleNamespace(
        rt=SimpleNamespace(sampler=sampler, version=version, problems={}),
        tc=SimpleNamespace(prompts_per_iteration=2),
        mgr=StalenessManager(1, 4, 2, start_version=version),
        experience=ExperienceBuffer(),
        groups={},
        prompts=PromptPool.from_batches(sampler.batch, 2),
        counts=Counter({"syncs": 3}),
        failures_of={},
    )


def test_the_orchestrators_state_keeps_finished_groups_and_regenerates_the_ones_in_flight(tmp_path):
    from services.rollout import checkpoint
    from services.rollout.orchestrator import _GroupState
    from services.trainer.learner import Group

    runner = _orchestrator_state(ProblemSampler(5))
    problems = [runner.prompts.take() for _ in range(3)]
    for p in problems:
        runner.mgr.reserve(p.prompt_id, 0)
        runner.groups[p.prompt_id] = _GroupState(p, 0)
    done = problems[1].prompt_id
    sample = SampleRecord(done, done, 0, (1,), (2,), (0.0,), 0, "stop", 0.0, 0.0, 0.0)
    runner.experience.put(done, Group([sample, sample], [1.0, 0.0]))
    runner.mgr.occupy(done, 0)
    runner.groups[done].complete = True
    next_up = runner.prompts.queued()
    # through a real checkpoint file (everything in it must pickle)
    recovery.save_atomic(tmp_path, 0, {"runner": checkpoint.capture(runner)})
    state = recovery.load(recovery.newest(tmp_path))["runner"]

    sampler = ProblemSampler(5)
    sampler.restore(state["sampler"])
    again = checkpoint.restore(state, 0, sampler.batch, 2)
    assert list(again.manager.tracked()) == [done] and again.manager.entry(done).state == "occupied"
    problem, v_traj, group = again.finished[done]
    assert problem == problems[1] and v_traj == 0 and group.rewards == [1.0, 0.0]
    assert again.counts["regenerated_after_restart"] == 2 and again.counts["syncs"] == 3
    expected = [problems[0], problems[2], *next_up, *ProblemSampler(5).batch(6)[4:]]
    assert [again.prompts.take() for _ in range(len(expected))] == expected
    with pytest.raises(ValueError, match="head 0 is not the trainer's version 1"):
        checkpoint.restore(recovery.load(recovery.newest(tmp_path))["runner"], 1, sampler.batch, 2)
    assert again.counts == {"syncs": 3, "regenerated_after_restart": 2}


def _step(learner, groups) -> None:
    learner.begin()
    learner.backward(groups)
    learner.step()


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_a_restored_learner_takes_the_step_the_original_takes(tmp_path, algorithm):
    """Through a checkpoint file: weights, AdamW moments (and PPO's critic) continue exactly."""
    import torch

    from services.common.config import RunConfig
    from services.policy.model import build_policy
    from services.trainer.learner import Learner
    from tests.unit.test_learner import MODEL, _groups

    cfg = RunConfig.model_validate({"model": MODEL, "trainer": {"lr": 1e-2, "algorithm": {"name": algorithm}}})
    torch.manual_seed(0)
    original = Learner(cfg, build_policy(cfg.model))
    _step(original, _groups())
    recovery.save_atomic(tmp_path, 1, {"learner": original.state()})
    _step(original, _groups())
    torch.manual_seed(1)  # another starting point: everything must come from the checkpoint
    restored = Learner(cfg, build_policy(cfg.model))
    restored.load_state(recovery.load(recovery.newest(tmp_path))["learner"])
    _step(restored, _groups())
    for module in ("model", "critic") if algorithm == "ppo" else ("model",):
        a, b = getattr(original, module).state_dict(), getattr(restored, module).state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a), module


def test_wire_offsets_put_a_resumed_version_above_every_earlier_attempt(tmp_path):
    from types import SimpleNamespace

    from services.run.resume import wire_offset

    def rt(attempt, version):
        return SimpleNamespace(run_dir=tmp_path, attempt=attempt, version=version,
                               cfg=SimpleNamespace(trainer=SimpleNamespace(iterations=10)))

    assert wire_offset(rt(0, 0), -1) == 0  # fresh: wire versions 0..10
    assert wire_offset(rt(1, 4), 6) == 7  # the router saw 6, but attempt 0 may have reached 10: v4 -> 11
    assert wire_offset(rt(2, 2), 30) == 29  # an instance reports 30: v2 -> 31
    assert wire_offset(rt(3, 0), 0) == 40  # attempt 2 may have reached 29 + 10
