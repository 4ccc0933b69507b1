"""Episodes played by an agent that speaks only the OpenAI API (``agentic.agent``).

Instead of Braid's EnvManager generating each turn and stepping the environment, each trajectory's
episode goes to the user's agent: a function ``agent(episode: AgentEpisode) -> float | None`` that
gets a base URL, a session key, the model name, the task, its seed and first observation, plays
the episode through the gateway with any OpenAI client, and returns the episode's reward.
``AgentManager`` stands where an ``EnvManager`` stands (the runner sees the same ``run``,
``result``, ``generated_tokens``, ``abandon``, ``wait_closed``): it opens the gateway session at
the trajectory's reserved version (every turn is generated with weights at least that new, as the
staleness bound requires), runs the agent on a thread of its own, closes the session and turns its
segments into ``Trajectory`` objects: the last segment is the trajectory, earlier ones (history
edits) travel in its ``segments`` and are trained beside it with the same reward.

An agent that raises, returns no reward (or not a finite number) or never called the API loses
its trajectory as a ``Dropped`` with the reason (counted, replaced like an environment failure).
"""

from __future__ import annotations

import asyncio
import importlib
import math
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, replace

from services.agentic.trajectory import Dropped, Trajectory, Turn
from services.gateway.sessions import Session, Sessions
from services.gateway.transcript import ChatTokenizer, Segment


@dataclass(frozen=True)
class AgentEpisode:
    """What an agent gets for one episode."""

    base_url: str  # the gateway, e.g. http://127.0.0.1:PORT/v1 (``openai.OpenAI(base_url=...)``)
    api_key: str  # this episode's session key
    model: str  # the model name to ask for
    task: str  # the environment kind (e.g. "calculator")
    seed: int  # the episode's seed (the environment's reset(seed))
    prompt: str  # the environment's first observation
    max_turns: int  # the run's turn limit (``agentic.max_turns``)
    max_tokens: int  # a call's max_tokens at most (``agentic.max_new_tokens_per_turn``)


Agent = Callable[[AgentEpisode], float | None]


def load_agent(spec: str) -> Agent:
    """``module:function`` -> the function (a clear error when it is not there or not callable)."""
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"agentic.agent must be 'module:function', got {spec!r}")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"agentic.agent {spec!r}: {exc}") from exc
    if not callable(fn):
        raise ValueError(f"agentic.agent {spec!r} is not callable")
    return fn


def segment_trajectory(seg: Segment, tokenizer: ChatTokenizer, *, trajectory_id: str, kind: str, seed: int,
                       reward: float, started_at: float, finished_at: float) -> Trajectory:
    """One segment as a trajectory: its calls as turns (the generated text as the action, the
    context appended after it as the observation), the reward on the last turn."""
    turns = []
    for k, call in enumerate(seg.calls):
        end = seg.calls[k + 1].gen_start if k + 1 < len(seg.calls) else len(seg.token_ids)
        gen = seg.token_ids[call.gen_start: call.gen_start + call.gen_len]
        obs = seg.token_ids[call.gen_start + call.gen_len: end]
        last = k == len(seg.calls) - 1
        turns.append(Turn(k, tokenizer.decode_text(gen), call.gen_start, call.gen_len, len(obs), call.weight_version,
                          call.finish_reason, reward if last else 0.0, observation=tokenizer.decode(obs)))
    return Trajectory(f"{trajectory_id}/s{seg.index}", kind, seed, tuple(seg.token_ids), tuple(seg.loss_mask),
                      tuple(seg.logprobs), seg.prompt_len, tuple(turns), reward, "done", started_at, finished_at,
                      prompt_text=tokenizer.decode(seg.token_ids[: seg.prompt_len]))


class AgentManager:
    """One trajectory played by the agent through the gateway (module docstring)."""

    def __init__(self, trajectory_id: str, kind: str, seed: int, *, agent: Agent, sessions: Sessions,
                 episode: Callable[[str], AgentEpisode], executor: Executor, clock: Callable[[], float],
                 min_version: int = 0) -> None:
        self.trajectory_id, self.kind, self.seed, self.min_version = trajectory_id, kind, seed, min_version
        self.agent, self.sessions, self.episode, self.executor, self.clock = agent, sessions, episode, executor, clock
        self.session: Session | None = None
        self._result: Trajectory | Dropped | None = None
        self.started_at = self.finished_at = 0.0

    @property
    def generated_tokens(self) -> int:
        return sum(s.generated_tokens for s in self.session.transcript.segments) if self.session is not None else 0

    async def run(self) -> Trajectory | Dropped:
        self.started_at = self.clock()
        self.session = self.sessions.open(self.kind, self.seed, self.min_version, sid=self.trajectory_id)
        try:
            reward = await asyncio.get_running_loop().run_in_executor(self.executor, self.agent,
                                                                     self.episode(self.session.key))
        except Exception as exc:  # noqa: BLE001 - the user's agent failed: its trajectory is dropped with the reason
            return self._drop("AGENT_ERROR", f"the agent raised {exc!r}")
        finally:
            self._close()
        self.finished_at = self.clock()
        if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
            return self._drop("NO_REWARD", f"the agent returned {reward!r}, not a finite reward")
        segments = [s for s in self.session.transcript.segments if s.calls]
        if not segments:
            return self._drop("NO_CALLS", "the agent never called the gateway")
        trajs = [segment_trajectory(s, self.sessions.tokenizer, trajectory_id=self.trajectory_id, kind=self.kind,
                                    seed=self.seed, reward=float(reward), started_at=self.started_at,
                                    finished_at=self.finished_at) for s in segments]
        self._result = replace(trajs[-1], trajectory_id=self.trajectory_id, segments=tuple(trajs[:-1]))
        return self._result

    def result(self) -> Trajectory | Dropped:
        assert self._result is not None, "the agent's episode has not ended"
        return self._result

    def abandon(self) -> None:
        """No longer wanted (its group is full or aborted): the session closes, so the agent's next
        call is refused (403) and its thread ends with its episode."""
        self._close()

    async def wait_closed(self) -> None:
        return None

    def _close(self) -> None:
        if self.session is not None and not self.session.closed:
            self.sessions.close(self.session.key)

    def _drop(self, code: str, reason: str) -> Dropped:
        self.finished_at = self.clock()
        turns = len(self.session.transcript.calls) if self.session is not None else 0
        self._result = Dropped(self.trajectory_id, self.kind, self.seed, turns, reason, code, self.generated_tokens)
        return self._result
