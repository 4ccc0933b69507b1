"""EnvManager, trajectory building and the two runners, with a scripted fake generator and the
worker's session table in process (no gRPC): masks, log-probs, no re-tokenizing, retries, drops."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from services.agentic.calculator import CalculatorEnv, demonstration
from services.agentic.client import EnvError
from services.agentic.manager import EnvManager, Limits
from services.agentic.runner import (
    LocalEnv,
    PolicyCodec,
    ThreadedEnv,
    make_managers,
    run_batch_level,
    run_trajectory_level,
)
from services.agentic.sessions import SessionTable
from services.agentic.trajectory import Dropped, Trajectory, TrajectoryBuilder
from services.common.config import load_config
from services.common.types import SampleRecord
from services.policy.model import Policy, char_tokenizer

CODEC = PolicyCodec(Policy(model=None, tokenizer=char_tokenizer()))  # type: ignore[arg-type]
EOS = CODEC.policy.eos_id
UNK = CODEC.policy.tokenizer.unk_token_id


def agentic(*overrides: str):
    return load_config(None, list(overrides)).agentic


class ScriptedGenerator:
    """Answers turn k of a trajectory with its scripted text (+ EOS), log-prob -(k+1)/100 per token,
    weight version k; records every sample returned."""

    def __init__(self, scripts: dict[str, list[str]], *, extra: tuple[int, ...] = (), delay_s: float = 0.0,
                 events: list | None = None, slow: dict[str, float] | None = None) -> None:
        self.scripts, self.extra, self.delay_s, self.events = scripts, extra, delay_s, events
        self.slow = slow or {}  # trajectory id -> extra delay of its first turn
        self.samples: dict[str, list[SampleRecord]] = {}

    async def generate(self, request_id: str, context: tuple[int, ...], max_new_tokens: int, *, min_version: int = 0,
                       task: str = "") -> SampleRecord:
        tid, turn = request_id.rsplit("/t", 1)
        k = int(turn)
        if self.events is not None:
            self.events.append(("gen", tid, k, time.monotonic()))
        await asyncio.sleep(self.delay_s + (self.slow.get(tid, 0.0) if k == 0 else 0.0))
        ids = self.extra + tuple(CODEC.encode_observation(self.scripts[tid][k])) + (EOS,)
        ids = ids[:max_new_tokens]
        s = SampleRecord(request_id, request_id, 0, context, ids, tuple(-(k + 1) / 100 for _ in ids), k,
                         "stop" if ids[-1] == EOS else "length", 0.0, 0.0, 0.0)
        self.samples.setdefault(tid, []).append(s)
        return s


def calc_scripts(cfg, seeds: list[int]) -> dict[str, list[str]]:
    out = {}
    for seed in seeds:
        env = CalculatorEnv.from_config(cfg)
        env.reset(seed)
        out[f"t{seed}"] = demonstration(env.problem)
    return out


def run(coro):
    return asyncio.run(coro)


def local_backend(cfg, executor, table=None):
    return ThreadedEnv(LocalEnv(table or SessionTable(cfg)), executor)


def test_builder_keeps_mask_and_logprobs_aligned():
    b = TrajectoryBuilder([1, 5, 6])
    assert b.add_generated([7, 8], [-0.5, -0.25]) == 3
    b.add_observation([9])
    t = b.build(trajectory_id="x", env_kind="calculator", seed=0, turns=[], status="done", started_at=0, finished_at=1)
    assert t.token_ids == (1, 5, 6, 7, 8, 9) and t.loss_mask == (0, 0, 0, 1, 1, 0)
    assert t.logprobs == (0.0, 0.0, 0.0, -0.5, -0.25, 0.0) and t.prompt_len == 3
    with pytest.raises(ValueError):
        b.add_generated([1], [])


def test_trajectory_tokens_are_prompt_generated_and_observations_exactly():
    cfg = agentic()
    scripts = calc_scripts(cfg, list(range(8)))
    gen = ScriptedGenerator(scripts, extra=(UNK,))  # a token decode drops: re-tokenizing would lose it
    with ThreadPoolExecutor(8) as ex:
        managers = make_managers([(t, int(t[1:])) for t in scripts], "calculator", [local_backend(cfg, ex)], gen, CODEC,
                                 Limits.from_config(cfg))
        result = run(run_trajectory_level(managers, concurrency=4))
    assert not result.dropped and len(result.trajectories) == 8
    for t in result.trajectories:
        env = CalculatorEnv.from_config(cfg)
        expected = CODEC.encode_prompt(env.reset(t.seed).text)
        assert t.token_ids[:t.prompt_len] == tuple(expected) and t.status == "done" and t.reward == 1.0
        for turn, sample in zip(t.turns, gen.samples[t.trajectory_id], strict=True):
            span = slice(turn.gen_start, turn.gen_start + turn.gen_len)
            assert t.token_ids[span] == sample.token_ids and t.token_ids[span][0] == UNK  # exactly what was generated
            assert t.logprobs[span] == sample.logprobs and set(t.loss_mask[span]) == {1}
            assert sample.prompt_token_ids == t.token_ids[:turn.gen_start]  # the context sent was the trajectory so far
            obs = env.step(CalculatorEnv.parse_action(turn.action_text)).observation.text
            obs_span = slice(span.stop, span.stop + turn.obs_len)
            assert t.token_ids[obs_span] == tuple(CODEC.encode_observation(obs)) and set(t.loss_mask[obs_span]) <= {0}
        assert sum(t.loss_mask) == sum(turn.gen_len for turn in t.turns) == len([lp for lp in t.logprobs if lp])
        assert (t.weight_versions == tuple(range(t.num_turns))
                and len(t.token_ids) == len(t.loss_mask) == len(t.logprobs))


def test_turn_limit_and_context_budget_end_trajectories():
    cfg = agentic("agentic.max_turns=2", "agentic.calculator.max_steps=6", "agentic.calculator.min_steps=4")
    scripts = calc_scripts(cfg, [1])
    with ThreadPoolExecutor(4) as ex:
        m = make_managers([("t1", 1)], "calculator", [local_backend(cfg, ex)], ScriptedGenerator(scripts), CODEC,
                          Limits.from_config(cfg))[0]
        t = run(m.run())
        assert isinstance(t, Trajectory) and t.status == "max_turns" and t.num_turns == 2 and t.reward == 0.0
        tight = Limits.from_config(agentic("agentic.max_context_tokens=30", "agentic.max_new_tokens_per_turn=8"))
        m = make_managers([("t1", 1)], "calculator", [local_backend(cfg, ex)],
                          ScriptedGenerator(scripts), CODEC, tight)[0]
        t = run(m.run())
    assert t.status == "context" and len(t.token_ids) + 8 > 30 and 0 < t.num_turns < len(scripts["t1"])


class FlakyEnv:
    """A backend whose steps fail ``fail`` times with ``code`` before reaching the real one."""

    def __init__(self, inner, code: str, fail: int) -> None:
        self.inner, self.code, self.fail, self.calls = inner, code, fail, 0

    async def reset(self, kind, seed, trajectory_id):
        return await self.inner.reset(kind, seed, trajectory_id)

    async def step(self, session_id, turn, action, timeout_s):
        self.calls += 1
        if self.fail:
            self.fail -= 1
            if self.code == "HANG":
                await asyncio.sleep(3600)
            raise EnvError(self.code, "injected")
        return await self.inner.step(session_id, turn, action, timeout_s)

    async def close(self, session_id):
        return await self.inner.close(session_id)


@pytest.mark.parametrize("code, fail, dropped", [("UNAVAILABLE", 2, False), ("UNAVAILABLE", 3, True),
                                                 ("NOT_FOUND", 1, True), ("HANG", 1, False), ("HANG", 3, True)])
def test_failed_steps_are_retried_then_dropped_and_counted(code, fail, dropped, monkeypatch):
    monkeypatch.setattr("services.agentic.manager.TIMEOUT_GRACE_S", 0.0)
    # the timeout is for the injected hangs; a real step (a thread-pool hop) must never meet it, however
    # busy the machine (at 0.2 s a loaded CI machine timed one out: a third failure, the trajectory dropped)
    timeout = 1.0 if code == "HANG" else 30.0
    cfg = agentic("agentic.step_retries=2", "agentic.retry_backoff_s=0.01", f"agentic.step_timeout_s={timeout}")
    scripts = calc_scripts(cfg, [0, 1])
    with ThreadPoolExecutor(4) as ex:
        table = SessionTable(cfg)
        flaky = FlakyEnv(local_backend(cfg, ex, table), code, fail)
        managers = make_managers([("t0", 0), ("t1", 1)], "calculator", [flaky, local_backend(cfg, ex, table)],
                                 ScriptedGenerator(scripts), CODEC, Limits.from_config(cfg))
        result = run(run_trajectory_level(managers, concurrency=2))
    assert [t.trajectory_id for t in result.trajectories] == (["t1"] if dropped else ["t0", "t1"])
    if dropped:
        d = result.dropped[0]
        assert isinstance(d, Dropped) and d.trajectory_id == "t0" and d.turns_done == 0
        assert d.code == ("TIMEOUT" if code == "HANG" else code)
        assert flaky.calls == (1 if code == "NOT_FOUND" else 3)  # not retried when retrying cannot help
    else:
        assert result.trajectories[0].turns[0].retries == fail and result.trajectories[0].reward == 1.0
    assert len(table) == 0  # every session was closed, dropped ones included


def test_batch_level_steps_in_lockstep_and_both_runners_agree():
    cfg = agentic("agentic.latency.kind=normal", "agentic.latency.mean_s=0.02", "agentic.latency.std_s=0.02")
    scripts = calc_scripts(cfg, list(range(6)))
    results, events = {}, {}
    for mode in ("trajectory", "batch"):
        events[mode] = []
        gen = ScriptedGenerator(scripts, delay_s=0.005, events=events[mode], slow={"t0": 0.3})
        with ThreadPoolExecutor(8) as ex:
            managers = make_managers([(t, int(t[1:])) for t in scripts], "calculator", [local_backend(cfg, ex)], gen,
                                     CODEC, Limits.from_config(cfg))
            results[mode] = run(run_trajectory_level(managers, 6) if mode == "trajectory"
                                else run_batch_level(managers))
    key = lambda r: sorted((t.trajectory_id, t.token_ids, t.reward) for t in r.trajectories)  # noqa: E731
    assert key(results["trajectory"]) == key(results["batch"]) and len(results["batch"].trajectories) == 6

    def lockstep(ev) -> bool:  # every turn-k generation starts before any turn-(k+1) one
        turns = max(k for _, _, k, _ in ev)
        return all(max(t for _, _, k, t in ev if k == j) <= min(t for _, _, k, t in ev if k == j + 1)
                   for j in range(turns))

    assert len(scripts["t0"]) > 1 and any(len(s) > 2 for t, s in scripts.items() if t != "t0")
    assert lockstep(events["batch"])  # t0's slow first turn holds every trajectory
    assert not lockstep(events["trajectory"])  # the others went on meanwhile


def test_unknown_kind_is_refused_when_the_manager_is_built():
    with pytest.raises(ValueError, match="unknown environment kind 'chess'"):
        EnvManager("t", "chess", 0, env=None, generator=None, codec=CODEC, limits=Limits.from_config(agentic()))  # type: ignore[arg-type]


def test_limits_are_checked_against_what_the_sgs_serves():
    from services.common.agentic_config import context_problem

    lim = agentic()  # 16 new tokens per turn, 384 tokens of context
    assert context_problem(lim, max_prompt_tokens=1024, max_new_tokens=256, max_positions=512) is None
    assert "generation.max_new_tokens (8)" in context_problem(lim, max_prompt_tokens=1024, max_new_tokens=8,
                                                              max_positions=512)
    assert "generation.max_prompt_tokens (64)" in context_problem(lim, max_prompt_tokens=64, max_new_tokens=256,
                                                                  max_positions=512)
    assert "the model's 128 positions" in context_problem(lim, max_prompt_tokens=1024, max_new_tokens=256,
                                                          max_positions=128)
