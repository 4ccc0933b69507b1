"""gRPC edge of the SGS router: the ``Generation`` service over ``RouterCore``.

Same contract and status codes as an instance (``server.py``): INVALID_ARGUMENT for malformed
requests (validated here, before anything is dispatched), RESOURCE_EXHAUSTED for oversized
messages (transport), FAILED_PRECONDITION for a prompt whose task has no instance routed to in its
pool (``generation.affinity``, docs/affinity.md; nothing is dispatched), and an instance's own
status when it fails or refuses (e.g. UNAVAILABLE when an instance is down, or when every instance
that may run a request is lost; FAILED_PRECONDITION / DATA_LOSS for a refused weight version),
with the instance named in the message. Weight versions reach the instances through
``fanout.WeightFanout``: ``UpdateWeights`` streams them through the router (direct transport),
``PullWeights`` tells each instance to pull from its own relay (relay transport); a version that
reached a lost instance makes it live again.

``AddInstance`` / ``RemoveInstance`` change the instance set at run time (dynamic DP
scale-out, docs/scaleout.md): INVALID_ARGUMENT for a malformed address or wait, ALREADY_EXISTS
for an instance already routed to (or joining, or still leaving), UNAVAILABLE when the new
instance does not answer, NOT_FOUND for an unknown one, FAILED_PRECONDITION for removing the last
instance (or the last of a pool that ``generation.affinity`` routes tasks to), DEADLINE_EXCEEDED
when a removed instance's in-flight work outlasts the wait (it keeps draining; a retry waits again).
"""

from __future__ import annotations

import logging
import math

import grpc

from services.common.address import parse_address
from services.common.config import GenerationConfig
from services.generation import convert
from services.generation.client import GenerationClient
from services.generation.fanout import FanoutError, WeightFanout
from services.generation.router import InstanceFailed, RouterCore
from services.generation.router_members import MembershipError
from services.generation.scheduling.pools import AffinityError
from services.generation.server import MAX_WAIT_S, RequestError, pull_problem, validate_request
from services.proto import braid_pb2 as pb
from services.proto import braid_pb2_grpc as pb_grpc

log = logging.getLogger("braid.router")


class RouterServicer(pb_grpc.GenerationServicer):
    def __init__(
        self, core: RouterCore, cfg: GenerationConfig, *, vocab_size: int, max_positions: int,
        keep_weights: bool = False, drain_timeout_s: float = 600.0,
    ) -> None:
        self.core = core
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.max_positions = max_positions
        self.drain_timeout_s = drain_timeout_s
        # keep_weights: the last pushed version stays in memory for instances that join later
        # the router takes a lost instance back once a version reached it (on_staged)
        self.fanout = WeightFanout(core.members.weight_clients, keep_last=keep_weights,
                                   on_staged=core.members.staged)

    def Generate(self, request: pb.GenerateRequest, context: grpc.ServicerContext):
        prompts, params = convert.request_from_pb(request)
        try:
            validate_request(prompts, params, self.cfg, vocab_size=self.vocab_size, max_positions=self.max_positions)
        except RequestError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        try:
            call = self.core.start(prompts, params)
        except AffinityError as err:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        except InstanceFailed as err:  # every instance that may run it is lost
            context.abort(err.code, str(err))
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
        if (why := pull_problem(request)) is not None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, why)
        try:
            acks = self.fanout.pull(request.version, request.wait_s)
        except FanoutError as err:
            context.abort(err.code, str(err))
        version = min(a.version for a in acks)
        log.info("weight version %d pulled by %d instances from their relays", version, len(acks))
        return pb.UpdateAck(version=version, staged=any(a.staged for a in acks), bytes=max(a.bytes for a in acks))

    def Health(self, request: pb.HealthRequest, context: grpc.ServicerContext) -> pb.HealthReply:
        try:
            return convert.health_to_pb(self.core.members.health())
        except grpc.RpcError as err:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"an instance did not answer Health: {err.details()}")

    def Interrupt(self, request: pb.InterruptRequest, context: grpc.ServicerContext) -> pb.InterruptReply:
        context.abort(grpc.StatusCode.UNIMPLEMENTED,
                      "the router does not migrate trajectories: send Interrupt to the SGS instance that runs them")

    def AddInstance(self, request: pb.InstanceRequest, context: grpc.ServicerContext) -> pb.InstanceReply:
        wait_s = _checked(request, context, default_wait_s=60.0)
        if (remaining := context.time_remaining()) is not None:  # never wait for a caller that gave up
            wait_s = min(wait_s, max(remaining, 0.0))
        client = GenerationClient(request.address, max_message_mb=self.cfg.max_message_mb)
        try:
            snapshot = client.wait_ready(timeout_s=wait_s)
        except grpc.RpcError as err:
            client.close()
            context.abort(grpc.StatusCode.UNAVAILABLE, f"instance {request.address} did not answer Health within "
                          f"{wait_s:.0f}s: {err.details()}")
        if snapshot.engine.startswith("router["):  # a router (this one or another) is not an engine instance
            client.close()
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{request.address} is an SGS router, not an instance")
        try:
            version = self.core.members.add_instance(client, lambda c, join: self.fanout.bring_up(c, wait_s, join))
        except (MembershipError, FanoutError) as err:
            client.close()
            context.abort(err.code, f"cannot add {request.address}: {err}")
        instances = self.core.members.addresses()
        log.info("instance %s added at weight version %d; %d instances", request.address, version, len(instances))
        return pb.InstanceReply(instances=instances, weight_version=version)

    def RemoveInstance(self, request: pb.InstanceRequest, context: grpc.ServicerContext) -> pb.InstanceReply:
        wait_s = _checked(request, context, default_wait_s=self.drain_timeout_s)
        try:
            drained = self.core.members.remove_instance(request.address, wait_s)
        except MembershipError as err:
            context.abort(err.code, f"cannot remove {request.address}: {err}")
        instances = self.core.members.addresses()
        log.info("instance %s removed after finishing %d sequences; %d instances", request.address, drained,
                 len(instances))
        return pb.InstanceReply(instances=instances, drained=drained)



def _checked(request: pb.InstanceRequest, context: grpc.ServicerContext, *, default_wait_s: float) -> float:
    """Validate an ``InstanceRequest``; return its wait (``default_wait_s`` when 0)."""
    try:
        parse_address(request.address)
    except ValueError as err:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
    if not math.isfinite(request.wait_s) or not 0 <= request.wait_s <= MAX_WAIT_S:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                      f"wait_s must be in [0, {MAX_WAIT_S:.0f}], got {request.wait_s}")
    return request.wait_s or default_wait_s
