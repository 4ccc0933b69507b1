"""The Reward gRPC service: the worker behind RPCs, protobuf converted at the edge.

Synchronous gRPC like every Braid server. Each Score call holds one server thread while it waits
for a scoring thread, so the server has ``threads + max_queue`` of them for Score plus a few more
(Health never waits behind scores). Every refusal is a status with a message: a request that does
not parse is INVALID_ARGUMENT (``MalformedRequests``), an unknown task, an oversized field or an
inconsistent transcript INVALID_ARGUMENT, a full worker RESOURCE_EXHAUSTED, a score slower than
``reward.timeout_s`` DEADLINE_EXCEEDED, a stopping worker UNAVAILABLE, a reward function that
raises INTERNAL.
"""

from __future__ import annotations

import grpc

from services.common.rpc import bind, new_server
from services.proto import braid_pb2 as pb
from services.proto import braid_pb2_grpc as pb_grpc
from services.reward.protocol import RewardRequest
from services.reward.worker import RewardRequestError, RewardWorker

CONTROL_THREADS = 8  # beyond threads + max_queue: Health and refusals never queue behind scores
MAX_MESSAGE_BYTES = 16 << 20  # a transcript: up to 1024 turns of 2 x 4096 characters (UTF-8, up to 4 bytes each)


def request_from_pb(request: pb.ScoreRequest) -> RewardRequest:
    return RewardRequest(request.request_id, request.task, request.seed, request.prompt, tuple(request.actions),
                         tuple(request.observations), request.reference, request.row_json)


def request_to_pb(request: RewardRequest) -> pb.ScoreRequest:
    return pb.ScoreRequest(request_id=request.request_id, task=request.task, seed=request.seed, prompt=request.prompt,
                           actions=list(request.actions), observations=list(request.observations),
                           reference=request.reference, row_json=request.row_json)


class RewardServicer(pb_grpc.RewardServicer):
    def __init__(self, worker: RewardWorker) -> None:
        self.worker = worker

    def Score(self, request: pb.ScoreRequest, context: grpc.ServicerContext) -> pb.ScoreReply:
        try:
            result = self.worker.score(request_from_pb(request))
        except RewardRequestError as err:
            context.abort(grpc.StatusCode[err.code], str(err))
        return pb.ScoreReply(reward=result.reward, kind=result.kind, info=dict(result.info), worker=result.worker,
                             score_s=result.score_s)

    def Health(self, request: pb.HealthRequest, context: grpc.ServicerContext) -> pb.RewardHealthReply:
        h = self.worker.health()
        return pb.RewardHealthReply(worker_id=h.worker_id, kind=h.kind, threads=h.threads, in_flight=h.in_flight,
                                    queued=h.queued, served=h.served, busy_s=h.busy_s, max_queue=h.max_queue)


def create_server(servicer: RewardServicer, address: str, *, threads: int, max_queue: int) -> tuple[grpc.Server, int]:
    """A server bound to ``address`` (port 0 picks a free port); returns (server, port)."""
    server = new_server(workers=threads + max_queue + CONTROL_THREADS, thread_name_prefix="reward-rpc",
                        max_message_bytes=MAX_MESSAGE_BYTES)
    pb_grpc.add_RewardServicer_to_server(servicer, server)
    return server, bind(server, address)
