"""Agentic training whose episodes an agent plays through the OpenAI-compatible gateway with the
official ``openai`` client (``agentic.agent``): SGS, environment and reward workers and the trainer
as real processes, the tiny policy given a chat template that lays a conversation out as Braid's
own multi-turn trajectories (the problem, each reply and its EOS, each tool result). Every trained
token is one the SGS generated for that call (its own generation log says so); a history edit is
recorded as a segment of its own and trained beside the episode's last segment."""

from __future__ import annotations

import json
import shutil

import pytest

from flows.launcher import run_processes
from ranker.genlog import GenerationLog
from services.agentic.episodes import first_observation
from services.common.config import load_config, write_config
from services.gateway.transcript import TRAJECTORY_TEMPLATE
from services.policy.model import load_policy
from tests.conftest import FAST_ENGINE, ROOT

# `make test-long` (CI runs it): whole agentic runs; the fast tier keeps the gateway's own tests
# against a real SGS (test_gateway.py) and its pure checks (docs/testing.md)
pytestmark = pytest.mark.long

AGENTIC = ["agentic.enabled=true", "agentic.concurrency=8", "trainer.prompts_per_iteration=2", "trainer.group_size=4",
           "trainer.micro_batch_groups=1", "eval.prompts=4", "agentic.max_turns=6", "trainer.mode=one_step",
           "trainer.iterations=3"]


@pytest.fixture(scope="module")
def chat_checkpoint(tiny_checkpoint, tmp_path_factory):
    """The tiny policy with a chat template in its tokenizer (the gateway needs one)."""
    path = tmp_path_factory.mktemp("chat") / "policy"
    shutil.copytree(tiny_checkpoint, path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TRAJECTORY_TEMPLATE}))
    return path


def _run(tmp_path, checkpoint, agent: str):
    cfg = load_config(ROOT / "deploy/configs/smoke.yaml", [
        FAST_ENGINE, *AGENTIC, f"agentic.agent={agent}", f"generation.genlog={tmp_path / 'gen.sqlite'}"])
    write_config(cfg, tmp_path / "config.json")
    (tmp_path / "metrics.jsonl").write_text("")
    summary = json.loads(run_processes(tmp_path, str(checkpoint), poll_s=0.2).read_text())
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    trajs = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    with GenerationLog(tmp_path / "gen.sqlite") as log:
        sgs = {r.prompt_id: r for r in log.recent(100_000)}
    return cfg, summary, rows, trajs, sgs


def _own_tokens(t: dict, sgs: dict, policy, first_call: int) -> None:
    """Each turn's generated ids are the SGS's sample for that call (length, version, the context it
    was given); nothing else is trained."""
    ids, mask = t["token_ids"], t["loss_mask"]
    assert not any(mask[: t["prompt_len"]])
    pos = t["prompt_len"]
    for k, turn in enumerate(t["turns"]):
        assert turn["gen_start"] == pos
        row = sgs[f"{t['trajectory_id']}/t{first_call + k}"]
        assert row.response_length == turn["gen_len"] and row.weight_version == turn["weight_version"]
        assert row.prompt == policy.decode(ids[:pos])
        assert mask[pos: pos + turn["gen_len"]] == [1] * turn["gen_len"]
        assert policy.decode(ids[pos: pos + turn["gen_len"]]) == turn["action"]
        pos += turn["gen_len"]
        assert not any(mask[pos: pos + turn["obs_len"]])
        pos += turn["obs_len"]
    assert pos == len(ids)


def test_an_agent_speaking_only_the_openai_api_trains_on_the_sgs_tokens(tmp_path, chat_checkpoint):
    cfg, summary, rows, trajs, sgs = _run(tmp_path, chat_checkpoint, "examples.calculator_agent:play")
    tc = cfg.trainer
    assert ([r["iteration"] for r in rows] == list(range(tc.iterations))
            and summary["final_weight_version"] == tc.iterations)
    assert len(trajs) == tc.iterations * tc.prompts_per_iteration * tc.group_size
    policy = load_policy(chat_checkpoint)
    for t in trajs:
        assert t["reward_info"]["source"] == "agent" and not t["segments"]
        assert t["prompt"] == "<bos>" + first_observation(cfg.agentic, t["env"], t["seed"]) and t["turns"]
        _own_tokens(t, sgs, policy, first_call=0)
    assert all(r["bound_violations"] == 0 and r["samples"] == tc.prompts_per_iteration * tc.group_size for r in rows)


def test_a_history_edit_is_a_segment_of_its_own_and_trains_beside_the_episode(tmp_path, chat_checkpoint):
    cfg, summary, rows, trajs, sgs = _run(tmp_path, chat_checkpoint, "tests.integration.gateway_agents:restarting")
    assert summary["final_weight_version"] == cfg.trainer.iterations and trajs
    policy = load_policy(chat_checkpoint)
    for t in trajs:
        (first,) = t["segments"]  # the abandoned first try
        assert first["turns"] == 1 and first["trajectory_id"] == f"{t['trajectory_id']}/s0"
        row = sgs[f"{t['trajectory_id']}/t0"]  # the first call's sample, as the SGS logged it
        generated = [i for i, m in zip(first["token_ids"], first["loss_mask"], strict=True) if m]
        assert generated == first["token_ids"][first["prompt_len"]:] and len(generated) == row.response_length
        assert row.prompt == policy.decode(first["token_ids"][: first["prompt_len"]])
        _own_tokens(t, sgs, policy, first_call=1)  # the SGS's calls number on across segments
    tc = cfg.trainer
    assert all(r["samples"] == 2 * tc.prompts_per_iteration * tc.group_size for r in rows)  # both segments trained
