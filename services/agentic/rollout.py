"""The machinery of agentic rollouts inside a trainer: an event loop, worker pools, reward scoring.

- ``RolloutLoop`` — an asyncio event loop on a daemon thread. The trainer's thread (which owns
  the staleness manager and the learner) submits one coroutine per trajectory (or per wave) and
  receives results as events; EnvManagers, the SGS generator and the reward scorer live on it.
- ``EnvPool`` — the environment workers: each new trajectory goes to the next worker round
  robin, skipping a worker whose last trajectory was dropped for being unreachable for
  ``suspend_s`` (the supervisor restarts a dead worker on its port; after the pause it is tried
  again), so a dead worker costs the trajectories it held and not the ones after.
- ``Scorer`` — turns a finished trajectory into its training reward (``ServiceScorer``: the
  reward service, what runs use; ``EnvScorer``: the environment's own rule-based reward, for
  tests). A scoring failure is a ``ScoreFailed`` (the trajectory is dropped and counted, like an
  environment failure).
- ``Rollout`` — the pieces together: managers for (trajectory id, episode, V_traj) and the
  held-out evaluation of a policy version.

Blocking gRPC calls run on one thread pool sized to the concurrency, so the loop never blocks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from services.agentic.client import EnvClient
from services.agentic.episodes import Episode
from services.agentic.manager import EnvBackend, EnvManager, Limits, TokenCodec
from services.agentic.runner import SgsGenerator, ThreadedEnv, run_trajectory_level
from services.agentic.trajectory import Dropped, Trajectory

SUSPEND_CODES = frozenset({"UNAVAILABLE", "TIMEOUT", "DEADLINE_EXCEEDED"})


class RolloutLoop:
    """An event loop on its own daemon thread; ``submit`` runs a coroutine on it from any thread."""

    def __init__(self, name: str = "agentic-rollout") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, Any], timeout_s: float | None = None) -> Any:
        """Run ``coro`` on the loop and wait for its result on this thread."""
        return self.submit(coro).result(timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Cancel what still runs on the loop (the session closes it schedules get to run), then stop it."""
        if self.loop.is_closed():
            return

        async def cancel_rest() -> None:
            me = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not me]
            for t in rest:
                t.cancel()
            await asyncio.wait(rest, timeout=timeout_s) if rest else None

        try:
            self.run(cancel_rest(), timeout_s + 1.0)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout_s)
            if not self._thread.is_alive():
                self.loop.close()


class EnvPool:
    """Environment workers; ``pick`` chooses the worker of a new trajectory (round robin over the
    workers not suspended). Called from the trainer's thread only."""

    def __init__(self, backends: Sequence[EnvBackend], *, clients: Sequence[EnvClient] = (), suspend_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not backends:
            raise ValueError("no environment workers")
        self.backends, self.clients = list(backends), list(clients)
        self.suspend_s, self.clock = suspend_s, clock
        self._until = [0.0] * len(self.backends)
        self._next = 0

    @classmethod
    def connect(cls, addresses: Sequence[str], executor: concurrent.futures.Executor, **kwargs) -> EnvPool:
        """A pool over worker processes at ``addresses`` (gRPC clients, calls on ``executor``)."""
        clients = [EnvClient(a) for a in addresses]
        return cls([ThreadedEnv(c, executor) for c in clients], clients=clients, **kwargs)

    def pick(self) -> int:
        n, now = len(self.backends), self.clock()
        for k in range(n):
            i = (self._next + k) % n
            if self._until[i] <= now:
                break
        else:  # every worker is suspended: try the one whose pause ends first
            i = min(range(n), key=lambda j: self._until[j])
        self._next = (i + 1) % n
        return i

    def failed(self, index: int, code: str) -> None:
        """A trajectory on worker ``index`` was dropped with ``code``: pause the worker if it looks gone."""
        if code in SUSPEND_CODES:
            self._until[index] = self.clock() + self.suspend_s

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        for c in self.clients:
            c.wait_ready(timeout_s)

    def close(self) -> None:
        for c in self.clients:
            c.close_channel()


class ScoreFailed(Exception):
    """Scoring a trajectory failed for good (after the scorer's own retries)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


@dataclass(frozen=True)
class Score:
    reward: float
    info: dict[str, str]
    score_s: float = 0.0


class Scorer(Protocol):
    async def score(self, traj: Trajectory) -> Score: ...


class EnvScorer:
    """The environment's own rule-based reward, summed over the trajectory's turns (``source``
    ``agent``: the reward the agent returned for its episode, ``agentic.agent``)."""

    def __init__(self, source: str = "environment") -> None:
        self.source = source

    async def score(self, traj: Trajectory) -> Score:
        return Score(traj.reward, {"source": self.source})


class ServiceScorer:
    """The reward service's score (``services.reward``: a stateless pool of workers, RollArt's
    serverless reward): the trajectory's text (prompt, each action, each observation) goes to the
    least loaded worker, retried elsewhere on UNAVAILABLE/DEADLINE_EXCEEDED/RESOURCE_EXHAUSTED by
    the pool. The rule kind replays the transcript through a fresh environment, so a worker that
    reported another observation than the environment's is caught (INVALID_ARGUMENT: dropped)."""

    def __init__(self, pool, executor: concurrent.futures.Executor) -> None:
        self.pool, self.executor = pool, executor

    async def score(self, traj: Trajectory) -> Score:
        from services.reward.client import RewardError
        from services.reward.protocol import RewardRequest

        request = RewardRequest(traj.trajectory_id, traj.env_kind, traj.seed, traj.prompt_text,
                                tuple(t.action_text for t in traj.turns), tuple(t.observation for t in traj.turns))
        t0 = time.monotonic()
        try:
            result = await asyncio.get_running_loop().run_in_executor(self.executor, self.pool.score, request)
        except RewardError as err:
            raise ScoreFailed(err.code, err.message) from None
        info = {**result.info, "kind": result.kind, "worker": result.worker, "worker_s": f"{result.score_s:.6f}"}
        return Score(result.reward, info, time.monotonic() - t0)


class Rollout:
    """Everything a trainer needs to run multi-turn trajectories: the loop, the SGS generator, the
    environment pool, the codec, the limits, the scorer."""

    def __init__(self, *, loop: RolloutLoop, generator: SgsGenerator, envs: EnvPool, codec: TokenCodec, limits: Limits,
                 scorer: Scorer, executor: concurrent.futures.Executor,
                 agents: Callable[[str, Episode, int], Any] | None = None,
                 on_close: Sequence[Callable[[], None]] = ()) -> None:
        self.loop, self.generator, self.envs, self.codec = loop, generator, envs, codec
        self.limits, self.scorer, self.executor = limits, scorer, executor
        self.agents = agents  # (trajectory id, episode, V_traj) -> an AgentManager (``agentic.agent``)
        self.on_close = list(on_close)

    def manager(self, trajectory_id: str, episode: Episode, min_version: int) -> tuple[EnvManager, int]:
        """A manager for one trajectory of ``episode`` and the index of the worker the pool chose
        (with ``agentic.agent``, the agent's manager: it steps no worker of the pool)."""
        if self.agents is not None:
            return self.agents(trajectory_id, episode, min_version), 0
        i = self.envs.pick()
        m = EnvManager(trajectory_id, episode.kind, episode.seed, env=self.envs.backends[i], generator=self.generator,
                       codec=self.codec, limits=self.limits, clock=time.time, min_version=min_version)
        return m, i

    def evaluate(self, episodes: Sequence[Episode], version: int, concurrency: int, *, tag: str = "eval",
                 attempts: int = 3) -> list[Trajectory]:
        """Run every held-out episode once at ``version`` or newer (trajectory level); an episode
        dropped by an environment failure is run again, up to ``attempts`` times, then this raises."""
        todo = list(enumerate(episodes))
        done: dict[int, Trajectory] = {}
        last: list[Dropped] = []
        for attempt in range(attempts):
            made = {i: self.manager(f"{tag}-{i}.{attempt}", e, version) for i, e in todo}
            result = self.loop.run(run_trajectory_level([m for m, _ in made.values()], concurrency, clock=time.time))
            by_id: dict[str, Trajectory | Dropped] = {
                t.trajectory_id: t for t in [*result.trajectories, *result.dropped]
            }
            last = result.dropped
            for i, (m, worker) in made.items():
                r = by_id[m.trajectory_id]
                if isinstance(r, Trajectory):
                    done[i] = r
                else:
                    self.envs.failed(worker, r.code)
            todo = [(i, e) for i, e in todo if i not in done]
            if not todo:
                return [done[i] for i in range(len(episodes))]
        raise RuntimeError(f"{len(todo)} of {len(episodes)} evaluation episodes failed {attempts} times "
                           f"(last: {last[0].reason if last else '?'})")

    def close(self) -> None:
        self.loop.close()
        for fn in self.on_close:
            fn()
        self.envs.close()
        self.executor.shutdown(wait=False, cancel_futures=True)

