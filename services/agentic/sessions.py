"""The worker's session table: many environment sessions, stepped concurrently, with timeouts.

Mechanism behind the Environment service (``server.py`` maps its errors to gRPC statuses). Each
session holds one environment and a lock: a step takes the session's lock without waiting (a
second step of the same session while one runs is ``ABORTED``), sleeps the injected latency, then
runs the environment's step on the table's executor and waits at most what is left of
``step_timeout_s``. A step that times out or raises poisons its session (its state is unknown):
later steps get ``FAILED_PRECONDITION``. Steps are idempotent per turn: a retry of the step just
applied (same turn number, same action text) gets the recorded reply again, so a caller may retry
a step whose reply was lost without stepping twice.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

from services.agentic.latency import LatencySampler
from services.agentic.protocol import MAX_ACTION_CHARS, Environment, StepOutcome
from services.agentic.registry import ENVIRONMENTS
from services.common.agentic_config import AgenticConfig

MAX_ID_CHARS = 256


class EnvRequestError(Exception):
    """A request the table refuses; ``code`` names the gRPC status (``INVALID_ARGUMENT``, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Session:
    session_id: str
    kind: str
    trajectory_id: str
    env: Environment
    latency: LatencySampler
    touched: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    turns: int = 0
    done: bool = False
    failed: str = ""
    last: tuple[str, StepOutcome] | None = None  # the last applied step's action text and reply


class SessionTable:
    def __init__(self, cfg: AgenticConfig, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], object] | None = None) -> None:
        self.cfg = cfg
        self.steps = 0
        self._clock = clock
        self._stopping = threading.Event()
        self._sleep = sleep or self._stopping.wait  # interruptible by close()
        self._sessions: dict[str, Session] = {}
        self._mutex = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=cfg.worker_threads, thread_name_prefix="env-step")

    def __len__(self) -> int:
        return len(self._sessions)

    def kinds(self) -> list[str]:
        return ENVIRONMENTS.names()

    def reset(self, kind: str, seed: int, trajectory_id: str) -> tuple[str, str]:
        """Open a session; return (session id, first observation)."""
        if kind not in ENVIRONMENTS:
            raise EnvRequestError("INVALID_ARGUMENT",
                                  f"unknown environment kind {kind[:64]!r}; served: {ENVIRONMENTS.names()}")
        if len(trajectory_id) > MAX_ID_CHARS:
            raise EnvRequestError("INVALID_ARGUMENT", f"trajectory_id is longer than {MAX_ID_CHARS} characters")
        env = ENVIRONMENTS[kind].from_config(self.cfg)
        observation = env.reset(seed)
        session = Session(uuid.uuid4().hex, kind, trajectory_id, env, LatencySampler(self.cfg.latency, seed),
                          self._clock())
        with self._mutex:
            if len(self._sessions) >= self.cfg.max_sessions:
                raise EnvRequestError("RESOURCE_EXHAUSTED",
                                      f"this worker holds its limit of {self.cfg.max_sessions} sessions")
            self._sessions[session.session_id] = session
        return session.session_id, observation.text

    def close(self, session_id: str) -> int:
        """Close a session; return the steps it took."""
        with self._mutex:
            session = self._sessions.pop(session_id, None)
        if session is None:
            raise EnvRequestError("NOT_FOUND",
                                  f"no session {session_id[:64]!r} (closed, expired, or never opened here)")
        return session.turns

    def step(self, session_id: str, turn: int, action: str) -> StepOutcome:
        if len(action) > MAX_ACTION_CHARS:
            raise EnvRequestError("INVALID_ARGUMENT",
                                  f"action of {len(action)} characters; the limit is {MAX_ACTION_CHARS}")
        session = self._get(session_id)
        if not session.lock.acquire(blocking=False):
            raise EnvRequestError("ABORTED", f"a step of session {session_id} is in flight; retry after it")
        try:
            session.touched = self._clock()
            replay = self._check_turn(session, turn, action)
            return replay if replay is not None else self._apply(session, action)
        finally:
            session.touched = self._clock()
            session.lock.release()

    def _get(self, session_id: str) -> Session:
        with self._mutex:
            session = self._sessions.get(session_id)
        if session is None:
            raise EnvRequestError("NOT_FOUND",
                                  f"no session {session_id[:64]!r} (closed, expired, or never opened here)")
        return session

    @staticmethod
    def _check_turn(session: Session, turn: int, action: str) -> StepOutcome | None:
        """The recorded reply when this is a retry of the last step; raise when the step cannot apply."""
        if session.last is not None and turn == session.turns - 1 and action == session.last[0]:
            return session.last[1]
        if session.failed:
            raise EnvRequestError("FAILED_PRECONDITION", f"session {session.session_id} failed: {session.failed}")
        if session.done:
            raise EnvRequestError("FAILED_PRECONDITION",
                                  f"session {session.session_id}: the episode is over after {session.turns} turns")
        if turn != session.turns:
            raise EnvRequestError("FAILED_PRECONDITION",
                                  f"session {session.session_id} is at turn {session.turns}, not {turn}")
        return None

    def _apply(self, session: Session, action: str) -> StepOutcome:
        started = self._clock()
        timeout = self.cfg.step_timeout_s
        delay = session.latency.sample()
        self._sleep(min(delay, timeout))
        if delay >= timeout:
            return self._fail(session, "DEADLINE_EXCEEDED",
                              f"step took longer than {timeout}s (injected latency {delay:.3f}s)")
        parsed = ENVIRONMENTS[session.kind].parse_action(action)
        future = self._pool.submit(session.env.step, parsed)
        try:
            result = future.result(timeout=max(0.0, timeout - (self._clock() - started)))
        except FutureTimeout:
            return self._fail(session, "DEADLINE_EXCEEDED", f"step took longer than {timeout}s")
        except Exception as err:  # noqa: BLE001 - an environment bug: this session only, reported to its caller
            return self._fail(session, "INTERNAL", f"environment {session.kind!r} failed: {type(err).__name__}: {err}")
        session.turns += 1
        session.done = result.done
        outcome = StepOutcome(result.observation.text, result.reward, result.done, dict(result.info), session.turns,
                              delay, self._clock() - started)
        session.last = (action, outcome)
        self.steps += 1
        return outcome

    @staticmethod
    def _fail(session: Session, code: str, message: str) -> StepOutcome:
        session.failed = message
        raise EnvRequestError(code, f"session {session.session_id}: {message}")

    def evict_idle(self) -> list[str]:
        """Close the sessions idle longer than ``session_ttl_s`` (not those stepping); return their ids."""
        cutoff = self._clock() - self.cfg.session_ttl_s
        with self._mutex:
            stale = [s for s, v in self._sessions.items() if v.touched < cutoff and not v.lock.locked()]
            for sid in stale:
                del self._sessions[sid]
        return stale

    def shutdown(self) -> None:
        self._stopping.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
