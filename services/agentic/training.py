"""Multi-turn trajectories as training samples, and expert demonstrations for the warm start.

A ``Trajectory`` becomes one ``SampleRecord`` for the learner: the first observation's tokens are
the prompt, everything after it (each turn's generated tokens, then the observation's) is the
completion, and ``loss_mask`` marks the generated tokens only, so the policy is trained on its own
actions and never on what the environment said. Token ids, log-probs and the mask are the
trajectory's own (nothing re-tokenized); the sample's ``weight_version`` is the oldest version
that generated any of its turns (what staleness and the ledger count).

``demonstration`` plays an environment's expert (``Environment.expert``) through the pure
environment and lays the episode out exactly as the EnvManager would (prompt via the codec, each
action's text tokenized alone plus EOS as the generated part, each observation tokenized alone),
so the warm start trains on the token layout RL later produces. Pure; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.agentic.protocol import Environment
from services.agentic.trajectory import Trajectory
from services.common.types import SampleRecord


def to_sample(traj: Trajectory, group_id: str, index: int) -> SampleRecord:
    """The learner's view of ``traj`` (sample ``index`` of GRPO group ``group_id``)."""
    p = traj.prompt_len
    versions = traj.weight_versions
    last = traj.turns[-1].finish_reason if traj.turns else "stop"
    return SampleRecord(
        prompt_id=group_id, group_id=group_id, sample_index=index, prompt_token_ids=traj.token_ids[:p],
        token_ids=traj.token_ids[p:], logprobs=traj.logprobs[p:], weight_version=min(versions) if versions else -1,
        finish_reason=last, submitted_at=traj.started_at, started_at=traj.started_at, finished_at=traj.finished_at,
        loss_mask=traj.loss_mask[p:],
    )


@dataclass(frozen=True)
class Demonstration:
    prompt_ids: list[int]
    completion_ids: list[int]
    loss_mask: tuple[int, ...]  # over completion_ids: 1 on the expert's action tokens (and EOS)
    reward: float


def demonstration(env: Environment, seed: int, policy, max_turns: int) -> Demonstration:
    """The expert's episode ``seed`` of ``env`` as tokens of ``policy``'s tokenizer (at most
    ``max_turns`` turns: an expert longer than the rollout limit is cut where rollouts are)."""
    prompt = policy.encode_prompt(env.reset(seed).text)
    ids: list[int] = []
    mask: list[int] = []
    reward = 0.0
    for text in env.expert()[:max_turns]:
        action = [int(i) for i in policy.tokenizer.encode(text, add_special_tokens=False)] + [policy.eos_id]
        ids += action
        mask += [1] * len(action)
        out = env.step(env.parse_action(text))
        reward += out.reward
        obs = ([int(i) for i in policy.tokenizer.encode(out.observation.text, add_special_tokens=False)]
               if out.observation.text else [])
        ids += obs
        mask += [0] * len(obs)
        if out.done:
            break
    return Demonstration(prompt, ids, tuple(mask), reward)
