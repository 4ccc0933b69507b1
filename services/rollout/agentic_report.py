"""What an agentic run records about the trajectories it trained on: metrics and the trajectory log.

``consumed_metrics`` summarises one consumed buffer's trajectories for ``metrics.jsonl``: turns,
generated and observation tokens, time in generation, environment and reward, the weight
versions a trajectory spanned (the staleness histogram and the bound check are every
workflow's: ``services.rollout.lifecycle``).

``trajectories.jsonl`` (``TrajectoryLog``) has one line per trained trajectory: the step it
trained, its group and index, the episode, the reward (and the environment's own), the status,
per turn the action and observation texts, the token offsets of the generated and observation
tokens, the generating weight version, the finish reason and the timings, and the full token ids
and loss mask. It is what a user reads to see what the agent did, and what the tests check
against the SGS and the environment (every generated token as the SGS returned it, every
observation token the observation's own encoding).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from services.agentic.rollout import Score
from services.agentic.trajectory import Trajectory

Kept = dict[str, list[tuple[int, Trajectory, Score]]]  # group key -> (index, trajectory, score) trained


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def consumed_metrics(kept: Kept) -> dict:
    trajs = [t for group in kept.values() for _, t, _ in group]
    scores = [s for group in kept.values() for _, _, s in group]
    spans = [max(t.weight_versions) - min(t.weight_versions) for t in trajs if t.turns]
    statuses = Counter(t.status for t in trajs)
    return {
        "trajectories": len(trajs),
        "turns_mean": _mean([t.num_turns for t in trajs]),
        "turns_max": max((t.num_turns for t in trajs), default=0),
        "generated_tokens_mean": _mean([t.generated_tokens for t in trajs]),
        "observation_tokens_mean": _mean([sum(x.obs_len for x in t.turns) for t in trajs]),
        "context_tokens_max": max((len(t.token_ids) for t in trajs), default=0),
        "trajectory_s_mean": _mean([t.finished_at - t.started_at for t in trajs]),
        "gen_turn_s_mean": _mean([x.gen_s for t in trajs for x in t.turns]),
        "env_step_s_mean": _mean([x.env_s for t in trajs for x in t.turns]),
        "env_latency_s_mean": _mean([x.latency_s for t in trajs for x in t.turns]),
        "env_retries": sum(x.retries for t in trajs for x in t.turns),
        "reward_s_mean": _mean([s.score_s for s in scores]),
        "env_reward_mean": _mean([t.reward for t in trajs]),
        "version_span_max": max(spans, default=0),
        "status_hist": dict(sorted(statuses.items())),
    }


def trajectory_record(step: int, buffer_version: int, group: str, index: int, t: Trajectory, score: Score) -> dict:
    return {
        "step": step, "buffer_version": buffer_version, "group": group, "index": index,
        "trajectory_id": t.trajectory_id, "env": t.env_kind, "seed": t.seed, "status": t.status,
        "reward": score.reward, "reward_info": score.info, "env_reward": t.reward, "prompt": t.prompt_text,
        "prompt_len": t.prompt_len, "started_at": t.started_at, "finished_at": t.finished_at,
        "turns": [{"action": x.action_text, "observation": x.observation, "gen_start": x.gen_start,
                   "gen_len": x.gen_len, "obs_len": x.obs_len, "weight_version": x.weight_version,
                   "finish_reason": x.finish_reason,
                   "reward": x.reward, "retries": x.retries, "gen_s": round(x.gen_s, 6), "env_s": round(x.env_s, 6),
                   "latency_s": round(x.latency_s, 6)} for x in t.turns],
        "token_ids": list(t.token_ids), "loss_mask": list(t.loss_mask),
        # an agent's earlier segments (history edits), trained beside it with the same reward
        "segments": [{"trajectory_id": x.trajectory_id, "prompt_len": x.prompt_len, "token_ids": list(x.token_ids),
                      "loss_mask": list(x.loss_mask), "turns": len(x.turns)} for x in t.segments],
    }


class TrajectoryLog:
    def __init__(self, path: Path) -> None:
        self._f = path.open("a")

    def write(self, step: int, buffer_version: int, kept: Kept) -> None:
        lines = [json.dumps(trajectory_record(step, buffer_version, key, i, t, s))
                 for key, group in kept.items() for i, t, s in group]
        self._f.write("".join(line + "\n" for line in lines))
        self._f.flush()

    def close(self) -> None:
        self._f.close()
