"""The agentic coordinator (services.rollout.agentic) over in-process environments and a fake SGS:
full GRPO groups within the staleness bound, redundant trajectories aborted and counted, lost
trajectories replaced, a group given up after too many losses, batch-level waves."""

from __future__ import annotations

import asyncio
import random
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from services.agentic.client import EnvError
from services.agentic.manager import Limits
from services.agentic.registry import ENVIRONMENTS
from services.agentic.rollout import EnvPool, EnvScorer, Rollout, RolloutLoop
from services.agentic.runner import LocalEnv, PolicyCodec, ThreadedEnv
from services.agentic.sessions import SessionTable
from services.common.config import load_config
from services.common.types import SampleRecord
from services.policy.model import Policy, char_tokenizer
from services.rollout.agentic import AgenticRunner
from services.run.evaluations import Evaluations
from services.run.runtime import Published, TrainerRuntime
from services.trainer.learner import StepStats

POLICY = Policy(model=None, tokenizer=char_tokenizer())  # type: ignore[arg-type]
CODEC = PolicyCodec(POLICY)


class FakeSgs:
    """Answers each turn with the episode expert's action (or, with probability ``wrong``, a wrong
    answer), after a random delay; the weight version is the trainer's newest (>= min_version)."""

    def __init__(self, cfg, rt, wrong: float = 0.3, delay_s: float = 0.004) -> None:
        self.cfg, self.rt, self.wrong, self.delay_s = cfg, rt, wrong, delay_s
        self.rng = random.Random(0)
        self.min_versions: list[tuple[int, int]] = []  # (min_version, generating version)

    async def generate(self, request_id, context, max_new_tokens, *, min_version=0, task=""):
        await asyncio.sleep(self.rng.uniform(0, self.delay_s))
        key, rest = request_id.split("/", 1)
        turn = int(rest.rsplit("/t", 1)[1])
        env = ENVIRONMENTS[task].from_config(self.cfg.agentic)
        env.reset(int(key.split("-")[1]))
        expert = env.expert()
        text = expert[min(turn, len(expert) - 1)]
        if turn >= len(expert) - 1 and self.rng.random() < self.wrong:
            text = "#1"
        ids = (*CODEC.encode_observation(text), POLICY.eos_id)
        version = max(min_version, self.rt.version)
        self.min_versions.append((min_version, version))
        return SampleRecord(request_id, request_id, 0, context, ids, tuple(-0.1 for _ in ids), version, "stop", 0, 0, 0)


class FakeLearner:
    def __init__(self) -> None:
        self.stats = StepStats()
        self.backwarded: list[str] = []

    def begin(self) -> StepStats:
        self.stats = StepStats()
        return self.stats

    def backward(self, groups) -> None:
        self.backwarded += [g.samples[0].prompt_id for g in groups]


class FakeRuntime:
    tally = TrainerRuntime.tally

    def __init__(self, cfg, run_dir) -> None:
        self.cfg, self.run_dir, self.version, self.attempt, self.runner_state = cfg, run_dir, 0, 0, None
        self.learner, self.gen_busy = FakeLearner(), []
        self.sampler = SimpleNamespace(state=dict)
        self.publisher = SimpleNamespace(wait=lambda version: None, pushers=[])
        self.start_snapshot = None
        self.steps: list[list] = []
        self.rows: list[dict] = []
        self.suites = []  # an agentic run: its held-out episodes only, scored at the ends
        self.evaluations = Evaluations(self, run_dir)

    def step_and_snapshot(self, stats, offer, consumed) -> Published:
        assert offer
        self.steps.append(consumed)
        self.version += 1
        return Published(self.version, None, 0.0, 0.0)

    def record(self, k, t_start, t_end, acc, st, grad_norm, stall, extra) -> dict:
        row = {"iteration": k, "t_end": t_end, "samples": acc.samples, "staleness": list(acc.staleness), **extra}
        self.rows.append(row)
        return row

    def recovery_due(self, version: int) -> bool:
        return True

    def save_recovery(self, state) -> None:
        self.saved = state


class DeadFor:
    """An environment backend whose calls fail with UNAVAILABLE while ``dead(trajectory_id)``."""

    def __init__(self, inner, dead) -> None:
        self.inner, self.dead, self.sessions = inner, dead, {}

    async def reset(self, kind, seed, trajectory_id):
        if self.dead(trajectory_id):
            raise EnvError("UNAVAILABLE", "injected: worker gone")
        sid, obs = await self.inner.reset(kind, seed, trajectory_id)
        self.sessions[sid] = trajectory_id
        return sid, obs

    async def step(self, session_id, turn, action, timeout_s):
        if self.dead(self.sessions[session_id]):
            raise EnvError("UNAVAILABLE", "injected: worker gone")
        return await self.inner.step(session_id, turn, action, timeout_s)

    async def close(self, session_id):
        return await self.inner.close(session_id)


def _run(tmp_path, overrides, wrap=lambda i, backend: backend):
    cfg = load_config(None, ["agentic.enabled=true", "trainer.group_size=4", "trainer.prompts_per_iteration=2",
                             "trainer.iterations=4", "trainer.micro_batch_groups=1", "agentic.concurrency=16",
                             "agentic.step_retries=0", "agentic.retry_backoff_s=0", *overrides])
    rt = FakeRuntime(cfg, tmp_path)
    with ThreadPoolExecutor(48) as ex:
        table = SessionTable(cfg.agentic)
        backends = [wrap(i, ThreadedEnv(LocalEnv(table), ex)) for i in range(2)]
        sgs = FakeSgs(cfg, rt)
        rollout = Rollout(loop=RolloutLoop(), generator=sgs, envs=EnvPool(backends, suspend_s=0.2), codec=CODEC,  # type: ignore[arg-type]
                          limits=Limits.from_config(cfg.agentic), scorer=EnvScorer(), executor=ex)
        runner = AgenticRunner(rt, rollout, [])  # type: ignore[arg-type]
        try:
            runner.run(cfg.trainer.iterations)
        finally:
            rollout.loop.close()
    return rt, runner, sgs


def _check_steps(rt, runner, eta: int) -> None:
    tc = rt.cfg.trainer
    assert len(rt.steps) == tc.iterations and rt.version == tc.iterations
    keys = [g.samples[0].prompt_id for step in rt.steps for g in step]
    assert len(keys) == len(set(keys)) == tc.iterations * tc.prompts_per_iteration  # every group trained once
    for step in rt.steps:
        for g in step:
            assert len(g.samples) == tc.group_size and len({s.prompt_id for s in g.samples}) == 1
            assert all(sum(s.loss_mask) == s.trained_tokens > 0 for s in g.samples)
    for row in rt.rows:
        assert row["bound_violations"] == 0 and row["entry_staleness_max"] <= eta and max(row["staleness"]) <= eta
    c = runner.counts
    assert (c["trajectories_launched"]
            == c["trajectories_finished"] + c["trajectories_dropped"] + c["trajectories_aborted"])
    assert not runner.members and runner.running == 0


@pytest.mark.parametrize("mode, eta, interaction", [("bounded", 2, "trajectory"), ("sync", 0, "trajectory"),
                                                    ("one_step", 1, "batch")])
def test_full_groups_within_the_bound_with_redundant_trajectories_aborted(tmp_path, mode, eta, interaction):
    rt, runner, sgs = _run(tmp_path, [f"trainer.mode={mode}", f"trainer.eta={max(eta, 1)}",
                                      f"agentic.interaction={interaction}", "agentic.redundant_trajectories=2"])
    _check_steps(rt, runner, eta)
    assert all(v >= m for m, v in sgs.min_versions)  # no turn generated by weights older than its V_traj
    c = runner.counts
    if interaction == "trajectory":
        assert c["trajectories_aborted"] > 0  # surplus of full groups cancelled
    else:
        assert c["waves"] >= 2 and c["trajectories_aborted"] > 0
    if eta and interaction == "trajectory":  # asynchrony was used: a group trained after a newer version existed
        assert any(max(r["staleness"]) > 0 for r in rt.rows)
    lines = (tmp_path / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == rt.cfg.trainer.iterations * rt.cfg.trainer.prompts_per_iteration * rt.cfg.trainer.group_size


def test_trajectories_lost_with_a_worker_are_replaced_and_counted(tmp_path):
    dead = {"on": True}

    def wrap(i, backend):  # worker 0 is gone for the first trajectories that reach it
        return DeadFor(backend, lambda tid: i == 0 and dead["on"] and tid.endswith(("/0", "/1", "/2")))

    rt, runner, _ = _run(tmp_path, ["trainer.mode=bounded", "trainer.eta=1"], wrap)
    _check_steps(rt, runner, 1)
    c = runner.counts
    assert c["trajectories_dropped"] == c["dropped_UNAVAILABLE"] > 0 and c["replacements"] > 0
    assert c["groups_aborted_failures"] == 0


def test_a_group_is_given_up_after_too_many_losses(tmp_path):
    def wrap(i, backend):  # every trajectory of the first group fails, wherever it runs
        return DeadFor(backend, lambda tid: "a0g0/" in tid)

    rt, runner, _ = _run(tmp_path, ["trainer.mode=bounded", "trainer.eta=1", "agentic.max_replacements=2"], wrap)
    _check_steps(rt, runner, 1)
    c = runner.counts
    assert c["groups_aborted_failures"] == 1 and c["replacements"] == 2
    assert not any(g.samples[0].prompt_id.endswith("a0g0") for step in rt.steps for g in step)
