"""gRPC edge of the SGS router: the ``Generation`` service over ``RouterCore``.

Same contract and status codes as an instance (``server.py``): INVALID_ARGUMENT for malformed
requests (validated here, before anything is dispatched), RESOURCE_EXHAUSTED for oversized
messages (transport), and an instance's own status when it fails or refuses (e.g.
UNAVAILABLE when an instance is down, FAILED_PRECONDITION / DATA_LOSS for a refused weight
version), with the instance named in the message. Weight versions reach the instances through
``fanout.WeightFanout``: ``UpdateWeights`` streams them through the router (direct transport),
``PullWeights`` tells each instance to pull from its own relay (relay transport).
"""

from __future__ import annotations

import logging

import grpc

from services.common.config import GenerationConfig
from services.generation import convert
from services.generation.fanout import FanoutError, WeightFanout
from services.generation.router import InstanceFailed, RouterCore
from services.generation.server import RequestError, validate_request
from services.proto import braid_pb2 as pb
from services.proto import braid_pb2_grpc as pb_grpc

log = logging.getLogger("braid.router")


class RouterServicer(pb_grpc.GenerationServicer):
    def __init__(self, core: RouterCore, cfg: GenerationConfig, *, vocab_size: int, max_positions: int) -> None:
        self.core = core
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.max_positions = max_positions
        self.fanout = WeightFanout(core.clients)

    def Generate(self, request: pb.GenerateRequest, context: grpc.ServicerContext):
        prompts, params = convert.request_from_pb(request)
        try:
            validate_request(prompts, params, self.cfg, vocab_size=self.vocab_size, max_positions=self.max_positions)
        except RequestError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        call = self.core.start(prompts, params)
        context.add_callback(call.cancel)
        try:
            for sample in self.core.results(call, context.is_active):
                yield convert.sample_to_pb(sample)
        except InstanceFailed as err:
            context.abort(err.code, str(err))
        except RuntimeError as err:
            context.abort(grpc.StatusCode.INTERNAL, str(err))

    def UpdateWeights(self, request_iterator, context: grpc.ServicerContext) -> pb.UpdateAck:
        try:
            acks = self.fanout.push(request_iterator)
        except FanoutError as err:
            context.abort(err.code, str(err))
        log.info("weight version %d staged on %d instances", acks[0].version, len(acks))
        return pb.UpdateAck(
            version=acks[0].version, staged=all(a.staged for a in acks), bytes=acks[0].bytes, tensors=acks[0].tensors
        )

    def PullWeights(self, request: pb.PullWeightsRequest, context: grpc.ServicerContext) -> pb.UpdateAck:
        """Relay transport: every instance pulls the version from its own relay."""
        if request.version < -1 or request.wait_s < 0:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"version must be >= -1 and wait_s >= 0, got {request.version}, {request.wait_s}",
            )
        try:
            acks = self.fanout.pull(request.version, request.wait_s)
        except FanoutError as err:
            context.abort(err.code, str(err))
        version = min(a.version for a in acks)
        log.info("weight version %d pulled by %d instances from their relays", version, len(acks))
        return pb.UpdateAck(version=version, staged=any(a.staged for a in acks), bytes=max(a.bytes for a in acks))

    def Health(self, request: pb.HealthRequest, context: grpc.ServicerContext) -> pb.HealthReply:
        try:
            return convert.health_to_pb(self.core.health())
        except grpc.RpcError as err:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"an instance did not answer Health: {err.details()}")
