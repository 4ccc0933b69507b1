"""Client of an environment worker; speaks plain types, hides protobuf.

Every call has a deadline. ``EnvError`` carries the status and whether retrying the same call
may succeed (UNAVAILABLE: the worker is unreachable; DEADLINE_EXCEEDED: the reply did not come
in time; ABORTED: a previous attempt of the step is still running; the per-turn idempotency of
Step makes such retries safe).
"""

from __future__ import annotations

import time

import grpc

from services.agentic.protocol import StepOutcome
from services.common.rpc import connect
from services.proto import braid_pb2 as pb
from services.proto import braid_pb2_grpc as pb_grpc

RETRYABLE = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "ABORTED"})
MAX_MESSAGE_BYTES = 1 << 20


class EnvError(Exception):
    """A failed environment call: ``code`` (a gRPC status name or ``TIMEOUT``) and whether a retry may help."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.retryable = code in RETRYABLE or code == "TIMEOUT"


def _call(fn, request, timeout_s: float):
    try:
        return fn(request, timeout=timeout_s)
    except grpc.RpcError as err:
        raise EnvError(err.code().name, err.details() or "") from None


class EnvClient:
    def __init__(self, address: str, *, timeout_s: float = 60.0) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._channel = connect(address, max_message_bytes=MAX_MESSAGE_BYTES)
        self._stub = pb_grpc.EnvironmentStub(self._channel)

    def close_channel(self) -> None:
        self._channel.close()

    def __enter__(self) -> EnvClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_channel()

    def wait_ready(self, timeout_s: float = 30.0) -> pb.EnvHealthReply:
        """Poll Health until the worker answers (retrying only on UNAVAILABLE)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.health()
            except EnvError as err:
                if err.code != "UNAVAILABLE" or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def health(self) -> pb.EnvHealthReply:
        return _call(self._stub.Health, pb.HealthRequest(), 10.0)

    def reset(self, kind: str, seed: int, trajectory_id: str = "") -> tuple[str, str]:
        """Open a session; return (session id, first observation)."""
        reply = _call(self._stub.Reset, pb.ResetRequest(kind=kind, seed=seed, trajectory_id=trajectory_id),
                      self.timeout_s)
        return reply.session_id, reply.observation

    def step(self, session_id: str, turn: int, action: str, *, timeout_s: float | None = None) -> StepOutcome:
        request = pb.StepRequest(session_id=session_id, turn=turn, action=action)
        r = _call(self._stub.Step, request, timeout_s or self.timeout_s)
        return StepOutcome(r.observation, r.reward, r.done, dict(r.info), r.turn, r.latency_s, r.step_s)

    def close(self, session_id: str) -> int:
        """Close a session; return the steps it took."""
        return _call(self._stub.Close, pb.CloseRequest(session_id=session_id), self.timeout_s).turns
