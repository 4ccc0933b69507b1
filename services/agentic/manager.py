"""EnvManager (RollArt §5.3): one lightweight async controller per trajectory.

``reset`` the environment (through its worker), then per turn: generate the next action through
the SGS (token in: the whole running context as the prompt, one sample), parse it, ``step`` the
environment (with a timeout; a failed step is retried ``step_retries`` times with doubling
backoff, then the trajectory is dropped and counted), append the observation's tokens (tokenized
alone), until the environment ends the episode, ``max_turns`` is reached or the next turn would
not fit ``max_context_tokens``.

The phases are separate coroutines (``start``, ``generate_turn``, ``step_env``) so the
trajectory-level runner (each manager loops on its own) and the batch-level baseline (every
manager generates turn k, then every one steps, then turn k+1) drive the very same objects
(``runner.py``). The generator, the environment backend and the tokenizer are injected
(``ActionGenerator``, ``EnvBackend``, ``TokenCodec``): gRPC for real, fakes in unit tests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from services.agentic.client import EnvError
from services.agentic.protocol import Action, StepOutcome
from services.agentic.registry import ENVIRONMENTS
from services.agentic.trajectory import Dropped, Status, Trajectory, TrajectoryBuilder, Turn
from services.common.agentic_config import AgenticConfig
from services.common.types import SampleRecord

TIMEOUT_GRACE_S = 5.0  # the manager's own deadline lies past the worker's, which reports first


class TokenCodec(Protocol):
    def encode_prompt(self, text: str) -> list[int]: ...  # the first observation (BOS etc.)
    def encode_observation(self, text: str) -> list[int]: ...  # a later observation, alone
    def decode(self, ids: list[int]) -> str: ...  # a turn's generated ids -> action text (EOS dropped)


class ActionGenerator(Protocol):
    async def generate(self, request_id: str, context: tuple[int, ...], max_new_tokens: int) -> SampleRecord: ...


class EnvBackend(Protocol):
    """One environment worker as the manager sees it; failures raise ``EnvError``."""

    async def reset(self, kind: str, seed: int, trajectory_id: str) -> tuple[str, str]: ...
    async def step(self, session_id: str, turn: int, action: str, timeout_s: float) -> StepOutcome: ...
    async def close(self, session_id: str) -> int: ...


@dataclass(frozen=True)
class Limits:
    max_turns: int
    max_new_tokens: int
    max_context_tokens: int
    step_timeout_s: float
    step_retries: int
    retry_backoff_s: float

    @classmethod
    def from_config(cls, cfg: AgenticConfig) -> Limits:
        return cls(cfg.max_turns, cfg.max_new_tokens_per_turn, cfg.max_context_tokens, cfg.step_timeout_s,
                   cfg.step_retries, cfg.retry_backoff_s)


class Drop(Exception):
    """Environment failures exhausted the retries: the trajectory is dropped."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code


class EnvManager:
    def __init__(self, trajectory_id: str, kind: str, seed: int, *, env: EnvBackend, generator: ActionGenerator,
                 codec: TokenCodec, limits: Limits, clock: Callable[[], float] = time.monotonic) -> None:
        self.trajectory_id, self.kind, self.seed = trajectory_id, kind, seed
        self.env, self.generator, self.codec, self.limits, self.clock = env, generator, codec, limits, clock
        self._env_class = ENVIRONMENTS[kind]
        self.session_id = ""
        self.builder: TrajectoryBuilder | None = None
        self.turns: list[Turn] = []
        self.status: Status | None = None
        self.dropped: Dropped | None = None
        self.started_at = self.finished_at = 0.0
        self._pending: tuple[SampleRecord, int, float] | None = None  # generated, not yet stepped
        self._closing: asyncio.Task | None = None

    @property
    def finished(self) -> bool:
        return self.status is not None or self.dropped is not None

    async def start(self) -> None:
        """Open the environment session and tokenize its first observation."""
        self.started_at = self.clock()
        try:
            self.session_id, text = await self._retry("reset", lambda: self.env.reset(self.kind, self.seed, self.trajectory_id))
        except Drop as drop:
            return self._drop(drop)
        self.builder = TrajectoryBuilder(self.codec.encode_prompt(text))
        self._check_budget()

    async def generate_turn(self) -> None:
        """Generate the next action from the whole running context (token in, one sample)."""
        assert self.builder is not None and not self.finished and self._pending is None
        t0 = self.clock()
        context = self.builder.context()
        sample = await self.generator.generate(f"{self.trajectory_id}/t{len(self.turns)}", context, self.limits.max_new_tokens)
        if sample.prompt_token_ids != context:
            raise RuntimeError(f"{self.trajectory_id}: the SGS answered for another context than the one sent")
        if sample.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"{self.trajectory_id}: unexpected finish_reason {sample.finish_reason!r}")
        start = self.builder.add_generated(sample.token_ids, sample.logprobs)
        self._pending = (sample, start, self.clock() - t0)

    async def step_env(self) -> None:
        """Apply the pending action to the environment and append the observation's tokens."""
        assert self.builder is not None and self._pending is not None
        sample, start, gen_s = self._pending
        self._pending = None
        action: Action = self._env_class.parse_action(self.codec.decode(list(sample.token_ids)))
        t0, turn = self.clock(), len(self.turns)
        attempts: list[int] = []
        try:
            out = await self._retry("step", lambda: self._step_once(turn, action.text, attempts))
        except Drop as drop:
            return self._drop(drop)
        obs_ids = self.codec.encode_observation(out.observation) if out.observation else []
        self.builder.add_observation(obs_ids)
        self.turns.append(Turn(turn, action.text, start, len(sample.token_ids), len(obs_ids), sample.weight_version,
                               sample.finish_reason, out.reward, dict(out.info), len(attempts) - 1, gen_s,
                               self.clock() - t0, out.latency_s))
        if out.done:
            await self._finish("done")
        elif len(self.turns) >= self.limits.max_turns:
            await self._finish("max_turns")
        else:
            self._check_budget()

    async def run(self) -> Trajectory | Dropped:
        """Drive this trajectory alone (trajectory-level interaction) to its end."""
        await self.start()
        while not self.finished:
            await self.generate_turn()
            await self.step_env()
        return self.result()

    def result(self) -> Trajectory | Dropped:
        if self.dropped is not None:
            return self.dropped
        assert self.builder is not None and self.status is not None
        return self.builder.build(trajectory_id=self.trajectory_id, env_kind=self.kind, seed=self.seed, turns=self.turns,
                                  status=self.status, started_at=self.started_at, finished_at=self.finished_at)

    async def _step_once(self, turn: int, text: str, attempts: list[int]) -> StepOutcome:
        attempts.append(turn)
        return await self.env.step(self.session_id, turn, text, self.limits.step_timeout_s)

    async def _retry(self, what: str, call: Callable[[], object]):
        """``call()`` under a deadline, retried on retryable failures; raise ``Drop`` when they run out."""
        delay = self.limits.retry_backoff_s
        for attempt in range(self.limits.step_retries + 1):
            try:
                return await asyncio.wait_for(call(), self.limits.step_timeout_s + TIMEOUT_GRACE_S)  # type: ignore[arg-type]
            except asyncio.TimeoutError:
                code, reason = "TIMEOUT", f"{what} got no reply within {self.limits.step_timeout_s + TIMEOUT_GRACE_S}s"
            except EnvError as err:
                code, reason = err.code, f"{what}: {err}"
                if not err.retryable:
                    break
            if attempt < self.limits.step_retries:
                await asyncio.sleep(delay)
                delay *= 2
        raise Drop(code, f"{reason} (after {attempt + 1} attempts)")

    def _check_budget(self) -> None:
        assert self.builder is not None
        if len(self.builder) + self.limits.max_new_tokens > self.limits.max_context_tokens:
            self.status, self.finished_at = "context", self.clock()
            self._close_later()

    async def _finish(self, status: Status) -> None:
        self.status, self.finished_at = status, self.clock()
        self._close_later()

    def _drop(self, drop: Drop) -> None:
        self.finished_at = self.clock()
        self.dropped = Dropped(self.trajectory_id, self.kind, self.seed, len(self.turns), str(drop), drop.code)
        if self.session_id:
            self._close_later()

    def _close_later(self) -> None:
        """Close the session without holding up the trajectory (a dead worker's sessions are gone anyway)."""
        session_id, self.session_id = self.session_id, ""
        if session_id:
            self._closing = asyncio.get_running_loop().create_task(self._close(session_id))

    async def wait_closed(self) -> None:
        """Wait for the session's close (runners call it before returning)."""
        if self._closing is not None:
            await self._closing

    async def _close(self, session_id: str) -> None:
        try:
            await self.env.close(session_id)
        except EnvError:
            pass  # expired, or its worker is gone: nothing left to free
