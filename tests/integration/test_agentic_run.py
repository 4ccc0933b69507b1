"""Agentic training end to end: SGS, environment workers, reward workers and the trainer as real processes.

Every trained token is either one the SGS generated for that turn (its own generation log says
so: request, length, version, context) or the observation the environment returned, tokenized
alone; every trajectory's observations and reward replay exactly through a fresh environment;
every group is consumed once within the staleness bound; a killed environment worker costs only
the trajectories it held (counted, replaced) and is started again on its port."""

from __future__ import annotations

import json

import psutil
import pytest

from flows.launcher import run_processes
from ranker.genlog import GenerationLog
from services.agentic.registry import ENVIRONMENTS
from services.common.config import load_config, write_config
from services.policy.model import load_policy
from services.run.ledger import check_ledger
from tests.conftest import FAST_ENGINE, ROOT
from tests.integration.runs import kill_instance_after_first_step

AGENTIC = ["agentic.enabled=true", "agentic.workers=2", "agentic.concurrency=16", "trainer.prompts_per_iteration=2",
           "trainer.group_size=4", "trainer.micro_batch_groups=1", "eval.prompts=8", "agentic.max_turns=6"]


def _run(tmp_path, checkpoint, overrides, on_poll=None):
    cfg = load_config(ROOT / "deploy/configs/smoke.yaml", [FAST_ENGINE, *AGENTIC, *overrides])
    write_config(cfg, tmp_path / "config.json")
    (tmp_path / "metrics.jsonl").write_text("")
    summary = json.loads(run_processes(tmp_path, str(checkpoint), on_poll=on_poll, poll_s=0.2).read_text())
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    trajs = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    return cfg, summary, rows, trajs


def _check_groups(cfg, summary, rows, trajs) -> None:
    tc = cfg.trainer
    assert ([r["iteration"] for r in rows] == list(range(tc.iterations))
            and summary["final_weight_version"] == tc.iterations)
    assert len(trajs) == tc.iterations * tc.prompts_per_iteration * tc.group_size
    for r in rows:
        assert r["bound_violations"] == 0 and r["entry_staleness_max"] <= tc.eta and r["trajectories"] == 8
    c = rows[-1]  # launched = finished + dropped + aborted + the ones still running
    assert (c["trajectories_launched"]
            >= c["trajectories_finished"] + c["trajectories_dropped"] + c["trajectories_aborted"])


def _env_worker(run_dir, name):
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if cmd[1:3] == ["-m", "services.agentic"] and "--id" in cmd and cmd[cmd.index("--id") + 1] == name \
                and str(run_dir) in " ".join(cmd):
            return proc
    return None


def _check_tokens(cfg, trajs, policy, genlog) -> None:
    """Every trained token: the SGS's for its turn (its own log says so) or the observation's own encoding;
    a fresh environment replays every observation and the reward."""
    with GenerationLog(genlog) as log:
        sgs = {r.prompt_id: r for r in log.recent(100_000)}
    for t in trajs:
        ids, mask = t["token_ids"], t["loss_mask"]
        assert ids[:t["prompt_len"]] == policy.encode_prompt(t["prompt"]) and not any(mask[:t["prompt_len"]])
        env = ENVIRONMENTS[t["env"]].from_config(cfg.agentic)
        assert env.reset(t["seed"]).text == t["prompt"]
        pos, reward = t["prompt_len"], 0.0
        for k, turn in enumerate(t["turns"]):
            assert turn["gen_start"] == pos
            gen = ids[pos: pos + turn["gen_len"]]
            row = sgs[f"{t['trajectory_id']}/t{k}"]  # the SGS's own record of this turn's sample
            assert row.response_length == turn["gen_len"] and row.weight_version == turn["weight_version"]
            assert row.prompt == policy.decode(ids[:pos])  # the context it was given: the trajectory so far
            assert mask[pos: pos + len(gen)] == [1] * len(gen) and policy.decode(gen) == turn["action"]
            pos += len(gen)
            out = env.step(env.parse_action(turn["action"]))  # a fresh environment replays the episode
            assert out.observation.text == turn["observation"]
            obs = policy.tokenizer.encode(turn["observation"], add_special_tokens=False) if turn["observation"] else []
            assert ids[pos: pos + turn["obs_len"]] == obs and not any(mask[pos: pos + turn["obs_len"]])
            pos += turn["obs_len"]
            reward += out.reward
        assert pos == len(ids) == len(mask)
        assert t["reward"] == reward and t["reward_info"]["kind"] == "rule"  # the reward service's replay agrees


# the fast tier keeps multi-turn trajectories against a real SGS and a killed environment worker
# (test_env_service.py) and the trajectory-to-sample masks (tests/unit)
@pytest.mark.long  # `make test-long` (CI runs it; docs/testing.md)
def test_trained_tokens_are_the_sgs_s_or_the_environment_s_and_a_killed_worker_costs_only_its_own(
        tmp_path, tiny_checkpoint):
    killed: list[int] = []

    def kill_env_0_after_the_first_step():
        if killed or not (tmp_path / "metrics.jsonl").read_text().strip():
            return
        proc = _env_worker(tmp_path, "env-0")
        if proc is not None:
            proc.kill()
            killed.append(proc.pid)

    genlog = tmp_path / "gen.sqlite"
    cfg, summary, rows, trajs = _run(tmp_path, tiny_checkpoint, [
        "trainer.mode=bounded", "trainer.eta=1", "trainer.iterations=6", "agentic.redundant_trajectories=1",
        "agentic.latency.kind=fixed", "agentic.latency.mean_s=0.05", "agentic.retry_backoff_s=0.05",
        f"generation.genlog={genlog}"], on_poll=kill_env_0_after_the_first_step)
    assert killed, "env-0 was not found"
    _check_groups(cfg, summary, rows, trajs)
    assert check_ledger(tmp_path / "ledger.jsonl", iterations=6, groups_per_step=2).ok
    _check_tokens(cfg, trajs, load_policy(str(tiny_checkpoint)), genlog)
    last = rows[-1]
    assert last["trajectories_aborted"] > 0  # redundant trajectories of full groups were cancelled
    # the kill cost the trajectories env-0 held, counted and replaced; nothing on env-1; every group filled
    assert last["trajectories_dropped"] > 0 and last["replacements"] > 0
    assert last.get("dropped_on_env_1", 0) == 0 and last["dropped_on_env_0"] == last["trajectories_dropped"]
    assert last.get("groups_aborted_failures", 0) == 0
    restarts = [json.loads(x) for x in (tmp_path / "recovery" / "services.jsonl").read_text().splitlines()]
    assert [r["service"] for r in restarts] == ["env-0"]  # started again on its port
    assert _env_worker(tmp_path, "env-0") is None  # stopped with the run (the restarted one too)
    assert summary["eval_prompts"] == 8 and 0.0 <= summary["final_accuracy"] <= 1.0


@pytest.mark.long  # `make test-long` (CI runs it; docs/testing.md)
def test_a_killed_sgs_instance_comes_back_in_a_multi_turn_run(tmp_path, tiny_checkpoint):
    """The only SGS instance is killed after the first step: the turns it held fail UNAVAILABLE and
    wait; the launcher restarts it, the runner readmits it at the newest weights, the turns run
    again from their contexts, and every group is still trained once within the bound."""
    killed: list[int] = []

    cfg, summary, rows, trajs = _run(tmp_path, tiny_checkpoint, [
        "generation.instances=1", "trainer.mode=one_step", "trainer.iterations=3",
        "agentic.latency.kind=fixed", "agentic.latency.mean_s=0.05"],
        on_poll=kill_instance_after_first_step(tmp_path, killed, instance=None))
    assert killed, "the SGS instance was not found"
    _check_groups(cfg, summary, rows, trajs)
    assert check_ledger(tmp_path / "ledger.jsonl", iterations=3, groups_per_step=2).ok
    last = rows[-1]
    assert last["instances_lost"] == 1 and last["instances_readmitted"] == 1, last
    restarts = [json.loads(x) for x in (tmp_path / "recovery" / "services.jsonl").read_text().splitlines()]
    assert [r["service"] for r in restarts] == ["sgs-0"]


@pytest.mark.long  # `make test-long` (CI runs it; docs/testing.md)
def test_a_multi_turn_run_with_affinity_scales_out(tmp_path, tiny_checkpoint):
    """Multi-turn trajectories with hardware affinity (the calculator's turns on pool ``a``) and a
    scale-out event: a slow instance puts generation behind, the controller adds one (it joins pool
    ``a``, scaleout_pool), the runner brings it to the newest weights and places turns on it."""
    cfg, summary, rows, trajs = _run(tmp_path, tiny_checkpoint, [
        "generation.instances=1", "generation.dispatch.router='off'", "trainer.mode=one_step", "trainer.iterations=10",
        "generation.pools=[{name: a, instances: [0]}]", "generation.affinity={calculator: a}",
        "generation.step_delay_ms=[40]", "scaleout.enabled=true", "scaleout.max_instances=2", "scaleout.window=1",
        "scaleout.cooldown=1", "scaleout.scale_in=false"])
    _check_groups(cfg, summary, rows, trajs)
    events = [json.loads(x) for x in (tmp_path / "scaleout.jsonl").read_text().splitlines()]
    outs = [e for e in events if e["event"] == "scale_out"]
    assert len(outs) == 1 and outs[0]["instances"] == 2, events
    assert rows[-1]["instances_joined"] == 1 and rows[-1]["instance_turns"][1] > 0  # the new one served turns
    ack = json.loads((tmp_path / "sgs-membership-ack.json").read_text())
    assert ack[outs[0]["address"]]["state"] == "joined" and not (tmp_path / "router.log").exists()
    assert all(t["env"] == "calculator" for t in trajs)
