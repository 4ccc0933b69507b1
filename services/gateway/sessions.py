"""Rollout sessions of the OpenAI-compatible gateway: one per episode an agent plays.

Braid opens a session (task, seed) and hands the agent a base URL and the session's key; the agent
calls the API with the key as its bearer token; Braid closes the session with the episode's reward
and takes its segments to train. A session's calls run one at a time (its transcript is one
conversation); an unknown key is refused, and so is a closed one (its episode is over)."""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from dataclasses import dataclass, field

from services.gateway.transcript import ChatTokenizer, Transcript


class SessionError(Exception):
    """A request a session refuses: ``status`` and OpenAI's error ``code``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass
class Session:
    key: str  # the agent's bearer token (secret: never logged)
    id: str  # what logs and request ids name
    task: str
    seed: int
    transcript: Transcript
    min_version: int = 0  # generate with weights at least this new (the staleness bound's reservation)
    closed_at: float | None = None
    reward: float | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one call at a time

    @property
    def closed(self) -> bool:
        return self.closed_at is not None


class Sessions:
    """The open sessions, by key. Thread-safe: the rollout opens and closes from its own thread
    while the gateway's event loop serves calls."""

    KEY_PREFIX = "braid-"

    def __init__(self, tokenizer: ChatTokenizer, max_segments: int = 16, keep_closed: int = 4096) -> None:
        self.tokenizer, self.max_segments, self.keep_closed = tokenizer, max_segments, keep_closed
        self._sessions: dict[str, Session] = {}
        self._closed: list[str] = []
        self._lock = threading.Lock()

    def open(self, task: str, seed: int, min_version: int = 0, sid: str | None = None) -> Session:
        """A new session; ``sid`` names it in logs and SGS request ids (default: task, seed, random)."""
        session = Session(self.KEY_PREFIX + secrets.token_urlsafe(24), sid or f"{task}-{seed}-{secrets.token_hex(3)}",
                          task, seed, Transcript(self.tokenizer, self.max_segments), min_version)
        with self._lock:
            self._sessions[session.key] = session
        return session

    def get(self, key: str | None) -> Session:
        """The open session of ``key`` (a request's bearer token)."""
        with self._lock:
            session = self._sessions.get(key or "")
        if session is None:
            raise SessionError(401, "invalid_api_key", "unknown session key: use the key Braid gave this episode")
        if session.closed:
            raise SessionError(403, "session_closed", "this episode's session is closed: its reward was given")
        return session

    def close(self, key: str, reward: float | None = None) -> Session:
        """End the episode (no more calls); ``reward`` when the agent's side knows it."""
        session = self.get(key)
        session.closed_at, session.reward = time.time(), reward
        with self._lock:
            self._closed.append(key)
            while len(self._closed) > self.keep_closed:  # forget the oldest closed ones (their keys then unknown)
                self._sessions.pop(self._closed.pop(0), None)
        return session
