"""Multi-turn trajectories as training data (pure): the loss mask through packing and the learner's
sample, expert demonstrations laid out as rollouts are, the episode streams, the environment pool."""

from __future__ import annotations

import pytest

from services.agentic.calculator import CalculatorEnv
from services.agentic.episodes import EpisodeStream, eval_episodes, first_observation
from services.agentic.rollout import EnvPool
from services.agentic.runner import PolicyCodec
from services.agentic.training import demonstration, to_sample
from services.agentic.trajectory import TrajectoryBuilder, Turn
from services.agentic.walk import WalkEnv
from services.common.config import ConfigError, load_config
from services.common.types import SampleRecord
from services.generation.convert import sample_to_pb
from services.policy.batch import pack
from services.policy.model import Policy, char_tokenizer

POLICY = Policy(model=None, tokenizer=char_tokenizer())  # type: ignore[arg-type]
CODEC = PolicyCodec(POLICY)


def agentic(*overrides: str):
    return load_config(None, ["agentic.enabled=true", *overrides]).agentic


def test_pack_leaves_masked_completion_tokens_out_of_the_loss():
    batch = pack([[1, 2], [1]], [[5, 6, 7, 8], [9, 9]], pad_id=0, masks=[(1, 0, 0, 1), ()])
    # row 0: targets at positions 1..4 are 5,6,7,8 with mask 1,0,0,1; row 1: both completion tokens
    assert batch.completion_mask.tolist() == [[0, 1, 0, 0, 1], [1, 1, 0, 0, 0]]
    assert batch.input_ids.tolist() == [[1, 2, 5, 6, 7, 8], [1, 9, 9, 0, 0, 0]]
    with pytest.raises(ValueError, match="loss mask of 3 for 4"):
        pack([[1]], [[5, 6, 7, 8]], pad_id=0, masks=[(1, 0, 1)])


def _trajectory():
    b = TrajectoryBuilder([1, 20, 21])
    s0 = b.add_generated([30, 31, 2], [-0.1, -0.2, -0.3])
    b.add_observation([40, 41])
    s1 = b.add_generated([32, 2], [-0.4, -0.5])
    turns = [Turn(0, "a", s0, 3, 2, 4, "stop", 0.0), Turn(1, "b", s1, 2, 0, 6, "stop", 1.0)]
    return b.build(trajectory_id="g/0", env_kind="calculator", seed=7, turns=turns, status="done", started_at=1.0,
                   finished_at=2.0, prompt_text="x")


def test_a_trajectory_becomes_one_sample_whose_mask_covers_the_generated_tokens_only():
    t = _trajectory()
    s = to_sample(t, "g", 3)
    assert s.prompt_token_ids == (1, 20, 21)
    assert s.token_ids == (30, 31, 2, 40, 41, 32, 2) and s.loss_mask == (1, 1, 1, 0, 0, 1, 1)
    assert s.logprobs == (-0.1, -0.2, -0.3, 0.0, 0.0, -0.4, -0.5)
    assert s.weight_version == 4 and s.trained_tokens == 5  # the oldest generating version; observations excluded
    assert (s.prompt_id, s.sample_index, s.finish_reason) == ("g", 3, "stop")
    batch = pack([list(s.prompt_token_ids)], [list(s.token_ids)], 0, [s.loss_mask])
    trained = [int(batch.input_ids[0, t + 1]) for t in range(batch.completion_mask.shape[1])
               if batch.completion_mask[0, t]]
    assert trained == [30, 31, 2, 32, 2]  # exactly the generated ids, as generated
    with pytest.raises(ValueError, match="training sample"):
        sample_to_pb(s)  # a training sample never goes on the wire


def test_demonstration_lays_out_an_expert_episode_as_a_rollout_would():
    cfg = agentic()
    env = CalculatorEnv.from_config(cfg)
    d = demonstration(env, 11, POLICY, cfg.max_turns)
    env.reset(11)
    expert = env.expert()
    assert d.reward == 1.0 and d.prompt_ids == POLICY.encode_prompt(first_observation(cfg, "calculator", 11))
    # generated parts: each expert action + EOS (mask 1); observations tokenized alone (mask 0)
    pos, env2 = 0, CalculatorEnv.from_config(cfg)
    env2.reset(11)
    for text in expert:
        action = [*CODEC.encode_observation(text), POLICY.eos_id]
        assert d.completion_ids[pos: pos + len(action)] == action and set(d.loss_mask[pos: pos + len(action)]) == {1}
        pos += len(action)
        obs = env2.step(env2.parse_action(text)).observation.text
        ids = CODEC.encode_observation(obs) if obs else []
        assert d.completion_ids[pos: pos + len(ids)] == ids and set(d.loss_mask[pos: pos + len(ids)]) <= {0}
        pos += len(ids)
    assert pos == len(d.completion_ids) == len(d.loss_mask)


def test_training_episodes_never_repeat_a_held_out_problem_and_resume_where_they_stopped():
    cfg = agentic("agentic.calculator.max_steps=1", "agentic.calculator.max_value=130")  # few problems: collisions
    held = eval_episodes(cfg, 5, 40)
    held_obs = {first_observation(cfg, "calculator", e.seed) for e in held}
    stream = EpisodeStream(cfg, 0, held)
    drawn = stream.take(50)
    assert not {first_observation(cfg, "calculator", e.seed) for e in drawn} & held_obs
    assert stream.drawn > 50  # some draws were held-out problems and were skipped
    state = stream.state()
    more = stream.take(5)
    again = EpisodeStream(cfg, 0, held)
    again.restore(state)
    assert again.take(5) == more
    assert EpisodeStream(cfg, 0, held).take(50) == drawn  # deterministic


def test_walk_episodes_are_not_excluded_by_observation():
    cfg = agentic("agentic.env=walk")
    assert WalkEnv.held_out_by_observation is False
    held = eval_episodes(cfg, 5, 200)  # more than the 90 distinct start/target pairs: all of them held out
    assert len(EpisodeStream(cfg, 0, held).take(20)) == 20


def test_env_pool_round_robin_skips_a_worker_that_looked_dead_for_a_while():
    now = [0.0]
    pool = EnvPool(["w0", "w1", "w2"], suspend_s=5.0, clock=lambda: now[0])  # type: ignore[list-item]
    assert [pool.pick() for _ in range(4)] == [0, 1, 2, 0]
    pool.failed(1, "UNAVAILABLE")
    pool.failed(2, "INVALID_ARGUMENT")  # not a sign of a dead worker
    assert [pool.pick() for _ in range(4)] == [2, 0, 2, 0]
    now[0] = 1.0
    pool.failed(0, "TIMEOUT")
    pool.failed(2, "DEADLINE_EXCEEDED")
    assert pool.pick() == 1  # every worker paused: the one whose pause ends first (5.0, the others 6.0)
    now[0] = 6.0
    assert sorted(pool.pick() for _ in range(3)) == [0, 1, 2]
    pool.close()


@pytest.mark.parametrize("override, message", [
    ("trainer.algorithm.name=ppo", "ppo"),
    ("trainer.partial_rollout=true", "partial_rollout"),
    ("trainer.redundancy_samples=1", "redundancy_samples"),
    ("agentic.concurrency=4", "concurrency"),
    ("agentic.max_new_tokens_per_turn=300", "max_new_tokens"),
])
def test_agentic_runs_refuse_what_they_do_not_support(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["agentic.enabled=true", "trainer.group_size=8", override])


class _FakeClient:
    """An SGS client that answers at once and records what it was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple] = []

    def start(self, prompts, params):
        (p,) = prompts
        self.asked.append((p, params))
        sample = SampleRecord(p.prompt_id, p.prompt_id, 0, p.token_ids, (5, 2), (-0.1, -0.2), params.min_weight_version,
                              "stop", 0, 0, 0)
        return _Call([sample])


class _Call(list):
    def cancel(self) -> None:
        pass


def test_generator_tags_prompts_with_the_task_and_keeps_to_its_pool():
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from services.agentic.runner import SgsGenerator
    from services.generation.scheduling.pools import eligible_instances

    gen_cfg = load_config(None, ["generation.instances=3", "agentic.enabled=true",
                                 "generation.pools=[{name: a, instances: [0]}, {name: b, instances: [1, 2]}]",
                                 "generation.affinity={calculator: b, default: a}"]).generation
    clients = [_FakeClient() for _ in range(3)]
    with ThreadPoolExecutor(4) as ex:
        gen = SgsGenerator(clients, ex, eligible=lambda task, n: eligible_instances(task, gen_cfg, range(n)))

        async def turns():
            for k in range(6):
                await gen.generate(f"g{k % 3}/0/t{k}", (1, 2), 4, min_version=3, task="calculator")
            await gen.generate("w/0/t0", (1,), 4, task="walk")

        asyncio.run(turns())
    calc = [p for c in clients[1:] for p, _ in c.asked]
    assert len(calc) == 6 and {p.task for p in calc} == {"calculator"}
    assert all(params.min_weight_version == 3 for c in clients[1:] for _, params in c.asked)
    assert [p.task for p, _ in clients[0].asked] == ["walk"]  # the default pool


class _Held(list):
    """A call whose samples arrive once ``gate`` is set."""

    def __init__(self, samples, gate) -> None:
        super().__init__(samples)
        self.gate = gate

    def __iter__(self):
        assert self.gate.wait(10)
        return super().__iter__()

    def cancel(self) -> None:
        pass


def test_a_turn_returning_after_its_instance_was_lost_releases_nothing():
    """docs/fleet.md's defect: a turn whose call returns after its instance was lost drove the
    instance's in-flight count to -1, and after a readmission under-counted the new incarnation.
    The loss starts a new epoch of the row; the late turn's release is ignored."""
    import asyncio
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from services.agentic.runner import SgsGenerator

    gate = threading.Event()

    class Held(_FakeClient):
        def start(self, prompts, params):
            return _Held(super().start(prompts, params), gate)

    with ThreadPoolExecutor(4) as ex:
        gen = SgsGenerator([Held()], ex)

        async def late_return():
            turn = asyncio.ensure_future(gen.generate("g/0/t0", (1, 2), 4))
            while gen.fleet.snapshot()[0].inflight == 0:  # its call is out
                await asyncio.sleep(0.001)
            gen.fleet.mark_lost(0, "UNAVAILABLE")  # the rollout thread's loss (a failed weight push)
            assert gen.fleet.snapshot()[0].inflight == 0
            gen.fleet.mark_live(0, version=1)  # restarted and readmitted
            newer = gen.pick("h/0")  # the new incarnation's first turn
            gate.set()
            await turn  # the old turn returns now
            return newer

        newer = asyncio.run(late_return())
        assert gen.fleet.snapshot()[0].inflight == 1  # was 0: the late return took the newer turn's count
        assert gen.fleet.release(newer) and gen.fleet.snapshot()[0].inflight == 0

        gate.clear()

        async def lost_for_good():
            turn = asyncio.ensure_future(gen.generate("g/1/t0", (1, 2), 4))
            while gen.fleet.snapshot()[0].inflight == 0:
                await asyncio.sleep(0.001)
            gen.fleet.mark_lost(0, "UNAVAILABLE")
            gate.set()
            await turn

        asyncio.run(lost_for_good())
        assert gen.fleet.snapshot()[0].inflight == 0  # was -1


def test_service_scorer_sends_the_transcript_and_turns_failures_into_drops():
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from services.agentic.rollout import ScoreFailed, ServiceScorer
    from services.reward.client import RewardError
    from services.reward.protocol import RewardResult

    class Pool:
        def __init__(self, fail: bool) -> None:
            self.fail, self.asked = fail, []

        def score(self, request):
            self.asked.append(request)
            if self.fail:
                raise RewardError("UNAVAILABLE", "every worker is gone")
            return RewardResult(1.0, "rule", {"correct": "true"}, "reward-0", 0.001)

    t = _trajectory()
    with ThreadPoolExecutor(2) as ex:
        ok = Pool(False)
        score = asyncio.run(ServiceScorer(ok, ex).score(t))
        assert score.reward == 1.0 and score.info["worker"] == "reward-0" and score.info["correct"] == "true"
        (req,) = ok.asked
        assert (req.request_id, req.task, req.seed, req.prompt) == ("g/0", "calculator", 7, "x")
        assert req.actions == ("a", "b") and req.observations == ("", "")
        with pytest.raises(ScoreFailed) as err:
            asyncio.run(ServiceScorer(Pool(True), ex).score(t))
        assert err.value.code == "UNAVAILABLE"
