"""The Environment gRPC service: the session table behind RPCs, protobuf converted at the edge.

Synchronous gRPC like every Braid server: one thread per call, so a step sleeping its injected
latency or running a slow environment holds only its own thread (``agentic.worker_threads`` of
them, plus a few for Reset/Close/Health). Every refusal is a status with a message: a request
that does not parse is INVALID_ARGUMENT (``MalformedRequests``), an unknown kind or an oversized
field INVALID_ARGUMENT, an unknown session NOT_FOUND, a wrong turn or a finished/failed session
FAILED_PRECONDITION, a concurrent step of one session ABORTED, a slow step DEADLINE_EXCEEDED, a
full worker RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import logging

import grpc

from services.agentic.sessions import EnvRequestError, SessionTable
from services.common.rpc import bind, new_server
from services.proto import braid_pb2 as pb
from services.proto import braid_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
CONTROL_THREADS = 8  # beyond worker_threads: Reset, Close and Health never queue behind steps
MAX_MESSAGE_BYTES = 1 << 20  # actions and observations are short text


class EnvironmentServicer(pb_grpc.EnvironmentServicer):
    def __init__(self, table: SessionTable, worker_id: str = "") -> None:
        self.table = table
        self.worker_id = worker_id

    def Reset(self, request: pb.ResetRequest, context: grpc.ServicerContext) -> pb.ResetReply:
        try:
            session_id, observation = self.table.reset(request.kind, request.seed, request.trajectory_id)
        except EnvRequestError as err:
            context.abort(grpc.StatusCode[err.code], str(err))
        return pb.ResetReply(session_id=session_id, observation=observation)

    def Step(self, request: pb.StepRequest, context: grpc.ServicerContext) -> pb.StepReply:
        try:
            out = self.table.step(request.session_id, request.turn, request.action)
        except EnvRequestError as err:
            context.abort(grpc.StatusCode[err.code], str(err))
        return pb.StepReply(observation=out.observation, reward=out.reward, done=out.done, info=dict(out.info),
                            turn=out.turn, latency_s=out.latency_s, step_s=out.step_s)

    def Close(self, request: pb.CloseRequest, context: grpc.ServicerContext) -> pb.CloseReply:
        try:
            turns = self.table.close(request.session_id)
        except EnvRequestError as err:
            context.abort(grpc.StatusCode[err.code], str(err))
        return pb.CloseReply(turns=turns)

    def Health(self, request: pb.HealthRequest, context: grpc.ServicerContext) -> pb.EnvHealthReply:
        return pb.EnvHealthReply(worker_id=self.worker_id, sessions=len(self.table), steps=self.table.steps,
                                 kinds=self.table.kinds())


def create_server(servicer: EnvironmentServicer, address: str, *, threads: int) -> tuple[grpc.Server, int]:
    """A server bound to ``address`` (port 0 picks a free port); returns (server, port)."""
    server = new_server(workers=threads + CONTROL_THREADS, thread_name_prefix="env-rpc",
                        max_message_bytes=MAX_MESSAGE_BYTES)
    pb_grpc.add_EnvironmentServicer_to_server(servicer, server)
    return server, bind(server, address)
