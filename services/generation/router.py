"""The SGS router: one ``Generation`` service in front of N engine-instance processes.

Clients (the trainer in sync/one_step mode) talk to the router exactly as to a single SGS.
For each Generate call the router

1. validates the request (same rules and status codes as an instance);
2. expands it into sequences (prompt x sample) and finds each prompt's length estimate:
   the request's ``estimated_length`` (StreamRL's offline annotation) when set; otherwise the
   injected **length estimator** (``predict(prompts: list[str]) -> Sequence[float]``, e.g.
   the ranker package's ``RankerWatcher(root).get()``) on the decoded prompt text; otherwise
   none. Sequences without an estimate are still served: estimate-driven policies treat them
   as typical (median) sequences, and a request without any estimate is dispatched
   round-robin and admitted FCFS (``scheduling.dispatch``/``admission``);
3. splits the sequences by the pool their task maps to (``scheduling.pools``, RollArt's
   hardware affinity; one pool of every open instance without ``generation.affinity``) and
   asks the configured dispatch policy (a pure function from ``scheduling.dispatch``) for a
   plan per pool over that pool's instances, given their outstanding work, the recent length
   distribution, the estimator's recent errors (estimate -> actual pairs of finished samples)
   and the PTL profile's cost model; a task with no open instance in its pool is refused
   (``AffinityError``: FAILED_PRECONDITION at the edge) before anything is dispatched;
4. sends each instance its share as one Generate call (one sequence per wire prompt,
   ``prompt_id/sample_index``, estimates attached so the instance admits them LPT) and
   merges the instances' streams into the caller's stream in completion order, restoring
   the caller's prompt ids and sample indices;
5. logs a per-instance timeline (JSONL): one line per dispatched call (with its pools) and per
   finished sample (with its task and the instance's pool).

``UpdateWeights`` is forwarded to every instance (``fanout.WeightFanout``); ``Health``
aggregates the instances'. Mechanism only: every decision is the policy's.

Membership changes at run time (dynamic DP scale-out, docs/scaleout.md): instances live in
slots that are never reused, so in-flight calls keep their slot index. ``add_instance`` brings
a new instance to the current weights (the caller's ``bring_up``) before its slot opens for
dispatch; ``remove_instance`` closes a slot to new work and waits until the instance has
returned every sequence it holds (nothing is lost or re-run). Dispatch policies see only the
open slots of a pool, numbered densely, and the plan is mapped back to slots. An added instance
joins ``generation.scaleout_pool``; the last open instance of a pool that affinity routes to
cannot be removed.
"""

from __future__ import annotations

import itertools
import json
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import grpc

from services.common.config import GenerationConfig
from services.common.types import GenerateParams, HealthSnapshot, PromptSpec, SampleRecord
from services.generation.client import GenerateCall, GenerationClient
from services.generation.scheduling import (
    DispatchContext,
    DispatchPlan,
    EstimateErrorModel,
    InstanceLoad,
    InstanceSpec,
    LengthWindow,
    SeqRequest,
    dispatch,
)
from services.generation.scheduling.dispatch import tokens_in_flight
from services.generation.scheduling.lengths import LengthEstimator
from services.generation.scheduling.pools import (
    PoolShare,
    hardware_of_pool,
    last_of_routed_pool,
    merge_plans,
    pool_of_instance,
    routed_tasks,
    split_by_pool,
)

log = logging.getLogger("braid.router")


EstimatorProvider = Callable[[], "LengthEstimator | None"]  # called per request: hot-swapped rankers


class MembershipError(ValueError):
    """A refused membership change; ``code`` names the gRPC status the edge answers with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class InstanceFailed(RuntimeError):
    """An instance's Generate call failed; ``code`` is its gRPC status."""

    def __init__(self, index: int, address: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"instance {index} ({address}): {details}")
        self.index, self.code = index, code


@dataclass
class _Seq:
    wire_id: str
    prompt: PromptSpec  # the caller's prompt
    sample_index: int
    estimate: float | None
    instance: int = -1


@dataclass
class RouterCall:
    """One routed Generate call: samples arrive on ``out`` in completion order."""

    call_id: int
    expected: int
    plan: DispatchPlan
    estimate_source: str
    out: queue.Queue = field(default_factory=queue.Queue)
    handles: list[GenerateCall] = field(default_factory=list)
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True
        for h in self.handles:
            h.cancel()


_END = object()


class RouterCore:
    def __init__(
        self,
        clients: list[GenerationClient],
        cfg: GenerationConfig,
        *,
        spec: InstanceSpec | None = None,
        estimator: EstimatorProvider | None = None,
        decode: Callable[[Sequence[int]], str] | None = None,
        timeline_path: str | Path | None = None,
        estimator_name: Callable[[], str | None] | None = None,
    ) -> None:
        if not clients:
            raise ValueError("the router needs at least one instance")
        if cfg.pools and len(clients) != cfg.instances:
            raise ValueError(f"generation.pools describe {cfg.instances} instances (generation.instances); "
                             f"the router was given {len(clients)}")
        self.clients = clients
        self.cfg = cfg
        self.dcfg = cfg.dispatch
        self.spec = spec
        self.estimator = estimator
        self.decode = decode
        self.estimator_name = estimator_name  # which ranker answered (the store name), for the timeline
        self._lock = threading.Lock()
        self._drained = threading.Condition(self._lock)
        self._active = [True] * len(clients)
        self._outstanding = [0] * len(clients)
        self._work = [0.0] * len(clients)
        self._lengths = LengthWindow(self.dcfg.length_window)
        self._pairs: deque[tuple[float, float]] = deque(maxlen=self.dcfg.length_window)
        self._calls = itertools.count()
        self._membership = threading.RLock()  # dispatch vs add/remove
        self._joining: set[str] = set()
        # open for the router's life (line-buffered appends from many threads); close() closes it
        self._timeline = Path(timeline_path).open("a", buffering=1) if timeline_path else None  # noqa: SIM115
        self._timeline_lock = threading.Lock()
        self.estimator_failures = 0

    # ------------------------------------------------------------------ estimates
    def estimates(self, prompts: list[PromptSpec]) -> tuple[list[float | None], str]:
        """Per-prompt estimates and where they came from: request / estimator / mixed / none."""
        est: list[float | None] = [p.estimated_length or None for p in prompts]
        missing = [i for i, e in enumerate(est) if e is None]
        source = "request" if not missing else "none"
        model = self.estimator() if (missing and self.estimator is not None) else None
        if model is not None and self.decode is not None:
            try:
                predicted = list(model.predict([self.decode(prompts[i].token_ids) for i in missing]))
            except Exception:  # recover: a failing ranker must not stop generation
                self.estimator_failures += 1
                log.exception("length estimator failed; serving %d prompts without estimates", len(missing))
            else:
                if len(predicted) != len(missing):
                    raise RuntimeError(
                        f"length estimator returned {len(predicted)} estimates for {len(missing)} prompts"
                    )
                for i, value in zip(missing, predicted, strict=True):
                    est[i] = float(value) if value is not None and value > 0 else None
                source = "estimator" if len(missing) == len(prompts) else "mixed"
        return est, source

    # ------------------------------------------------------------------ dispatch
    def slots(self) -> list[int]:
        """The open slots (instances that receive new work), in slot order."""
        with self._lock:
            return [i for i, on in enumerate(self._active) if on]

    def addresses(self) -> list[str]:
        return [self.clients[i].address for i in self.slots()]

    def active_clients(self) -> list[GenerationClient]:
        return [self.clients[i] for i in self.slots()]

    def weight_clients(self) -> list[GenerationClient]:
        """The instances a new weight version goes to: the open slots and the closed ones still
        finishing work (a draining instance may hold a request that waits for this very version;
        leaving it out would leave that request, and the drain, waiting forever)."""
        with self._lock:
            return [c for i, c in enumerate(self.clients) if self._active[i] or self._outstanding[i] > 0]

    def context(self, members: Sequence[int], seed: int) -> DispatchContext:
        """The dispatch view of the open slots ``members`` (one pool's), numbered 0..n-1
        (``members[k]`` is instance ``k``)."""
        states = [self.clients[i].kv_state() for i in members] if self.dcfg.policy == "least_tokens" else None
        kv_tokens = self.cfg.num_blocks * self.cfg.page_size
        with self._lock:
            dist = self._lengths.distribution(self.dcfg.min_history)
            mean = dist.mean() if dist is not None else 0.0
            loads = tuple(InstanceLoad(k, self._outstanding[i], self._work[i],
                                       0.0 if states is None else tokens_in_flight(states[k], kv_tokens,
                                                                                  self._outstanding[i], mean))
                          for k, i in enumerate(members))
            pairs = list(self._pairs)
        errors = EstimateErrorModel(pairs) if len(pairs) >= self.dcfg.min_history else None
        return DispatchContext(
            instances=loads, spec=self.spec, lengths=dist, alpha=self.dcfg.alpha, admission=self.cfg.admission,
            errors=errors, scenarios=self.dcfg.scenarios, seed=seed,
            rotation=min(range(len(loads)), key=lambda i: (loads[i].outstanding, i)), unit=self.dcfg.unit,
        )

    def _plan(self, seqs: list[_Seq]) -> tuple[int, DispatchPlan, list[tuple[PoolShare, DispatchPlan]]]:
        """(seed, merged plan in slots, per-pool plans): the dispatch policy once per pool over
        that pool's open slots (all open slots without affinity). Called under ``_membership``."""
        pools = split_by_pool([s.prompt.task for s in seqs], self.cfg, self.slots())
        seed = self.dcfg.seed + next(self._calls)
        parts = []
        for pool in pools:
            share = [seqs[k] for k in pool.members]
            requests = [SeqRequest(s.wire_id, len(s.prompt.token_ids), s.estimate, group=s.prompt.prompt_id)
                        for s in share]
            parts.append((pool, dispatch(self.dcfg.policy, requests, self.context(pool.slots, seed))))
        return seed, merge_plans(parts), parts

    def start(self, prompts: list[PromptSpec], params: GenerateParams) -> RouterCall:
        """Dispatch a validated request and start one Generate call per instance that got work.
        Raises ``AffinityError`` (nothing dispatched) when a prompt's task has no open instance."""
        est, source = self.estimates(prompts)
        seqs: list[_Seq] = []
        for p, e in zip(prompts, est, strict=True):
            for k in range(params.samples_per_prompt):
                seqs.append(_Seq(f"{p.prompt_id}/{k}", p, k, e))
        with self._membership:  # no slot closes between the view and the booking of its share
            t_dispatch = time.time()  # taken under the lock: orders dispatches and removals in the timeline
            t0 = time.perf_counter()
            seed, plan, parts = self._plan(seqs)
            dispatch_s = time.perf_counter() - t0
            call = RouterCall(seed, len(seqs), plan, source)
            shares: list[list[_Seq]] = [[] for _ in self.clients]
            for s in seqs:
                s.instance = plan.assignment[s.wire_id]
                shares[s.instance].append(s)
            work = [sum(s.estimate or 0.0 for s in share) for share in shares]
            with self._lock:
                for i, share in enumerate(shares):
                    self._outstanding[i] += len(share)
                    self._work[i] += work[i]
        self._log_event({
            "event": "dispatch", "call": call.call_id, "tag": params.tag, "t": t_dispatch, "policy": plan.policy,
            "sequences": len(seqs), "per_instance": [len(s) for s in shares], "estimates": source,
            "ranker": self.estimator_name() if self.estimator_name and source in ("estimator", "mixed") else None,
            "dispatch_s": dispatch_s, "predicted_makespan_s": plan.predicted_makespan_s, "notes": plan.notes,
            "long_instances": list(plan.long_instances),
            "pools": [{"pool": pool.pool, "hardware": hardware_of_pool(pool.pool, self.cfg), "tasks": list(pool.tasks),
                       "instances": list(pool.slots), "sequences": len(pool.members),
                       "predicted_makespan_s": part.predicted_makespan_s} for pool, part in parts],
        })
        # a seeded call's seed goes along: each instance seeds a sample by its wire id (<prompt>/<k>),
        # so the sample is the same wherever the dispatch puts it
        wire_params = replace(params, samples_per_prompt=1)
        call.out.put(("open", sum(1 for share in shares if share)))
        for i, share in enumerate(shares):
            if not share:
                continue
            forward = self.dcfg.forward_estimates
            wire = [
                PromptSpec(s.wire_id, s.prompt.token_ids, s.prompt.group, (s.estimate or 0.0) if forward else 0.0,
                           s.prompt.forced_length, s.prompt.task)
                for s in share
            ]
            handle = self.clients[i].start(wire, wire_params)
            call.handles.append(handle)
            threading.Thread(
                target=self._read, args=(call, i, handle, {s.wire_id: s for s in share}),
                name=f"route-{call.call_id}-{i}", daemon=True,
            ).start()
        return call

    def _read(self, call: RouterCall, i: int, handle: GenerateCall, pending: dict[str, _Seq]) -> None:
        try:
            for sample in handle:
                seq = pending.pop(sample.prompt_id)
                self._finished(i, seq)
                out = replace(sample, prompt_id=seq.prompt.prompt_id, group_id=seq.prompt.group,
                              sample_index=seq.sample_index)
                self._observe(seq, out)
                self._log_event({
                    "event": "sample", "call": call.call_id, "instance": i, "seq": seq.wire_id,
                    "task": seq.prompt.task, "pool": pool_of_instance(i, self.cfg), "estimate": seq.estimate,
                    "tokens": len(out.token_ids), "submitted_at": out.submitted_at, "started_at": out.started_at,
                    "finished_at": out.finished_at,
                })
                call.out.put(out)
            call.out.put(_END)
        except grpc.RpcError as err:
            if not call.cancelled:
                call.out.put(InstanceFailed(i, self.clients[i].address, err.code(), err.details() or str(err)))
        except BaseException as exc:  # noqa: BLE001 - surfaced to the caller
            call.out.put(exc)
        finally:
            for seq in pending.values():  # never returned (failure or cancel): no longer outstanding
                self._finished(i, seq)

    def _finished(self, i: int, seq: _Seq) -> None:
        with self._lock:
            self._outstanding[i] -= 1
            self._work[i] = max(0.0, self._work[i] - (seq.estimate or 0.0))
            if self._outstanding[i] == 0:
                self._drained.notify_all()

    # ------------------------------------------------------------------ membership
    def add_instance(
        self, client: GenerationClient, bring_up: Callable[[GenerationClient, Callable[[], None]], int]
    ) -> int:
        """Route to ``client`` from now on. ``bring_up(client, join)`` gives it the current weights and
        calls ``join()`` (which opens its slot) while no newer version can be fanned out; returns the
        version it reported. Raises ``MembershipError`` for an address already routed to or joining."""
        with self._membership:
            if client.address in self.addresses() or client.address in self._joining:
                raise MembershipError(grpc.StatusCode.ALREADY_EXISTS, f"instance {client.address} is already routed to")
            self._joining.add(client.address)
        slot: list[int] = []

        def join() -> None:
            with self._membership, self._lock:
                self.clients.append(client)
                self._active.append(True)
                self._outstanding.append(0)
                self._work.append(0.0)
                slot.append(len(self.clients) - 1)

        try:
            version = bring_up(client, join)
        finally:
            with self._membership:
                self._joining.discard(client.address)
        if not slot:
            raise RuntimeError(f"bring-up of {client.address} returned without joining it")
        self._log_event({"event": "add_instance", "t": time.time(), "slot": slot[0], "address": client.address,
                         "pool": pool_of_instance(slot[0], self.cfg), "weight_version": version,
                         "instances": self.addresses()})
        return version

    def remove_instance(self, address: str, timeout_s: float) -> int:
        """Close ``address``'s slot to new work and wait until it returned its in-flight sequences;
        return how many it finished meanwhile. Raises ``MembershipError`` (unknown, last instance,
        or still busy after ``timeout_s``: the slot stays closed and its work still completes)."""
        with self._membership, self._lock:
            open_slots = [i for i, on in enumerate(self._active) if on]
            match = [i for i in open_slots if self.clients[i].address == address]
            if not match:
                raise MembershipError(grpc.StatusCode.NOT_FOUND, f"no routed instance at {address} (instances: "
                                      f"{[self.clients[i].address for i in open_slots]})")
            if len(open_slots) == 1:
                raise MembershipError(grpc.StatusCode.FAILED_PRECONDITION,
                                      f"{address} is the last instance; add another first")
            slot = match[0]
            if (pool := last_of_routed_pool(slot, self.cfg, open_slots)) is not None:
                raise MembershipError(grpc.StatusCode.FAILED_PRECONDITION,
                                      f"{address} is the last instance of pool {pool!r}, which generation.affinity "
                                      f"routes tasks {routed_tasks(pool, self.cfg)} to; add another first")
            self._active[slot] = False
            held = self._outstanding[slot]
            t_removed = time.time()  # under the lock, like a dispatch's "t"
        self._log_event({"event": "remove_instance", "t": t_removed, "slot": slot, "address": address,
                         "in_flight": held})
        with self._lock:
            if not self._drained.wait_for(lambda: self._outstanding[slot] == 0, timeout=timeout_s):
                raise MembershipError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                      f"{address} still holds {self._outstanding[slot]} sequences after "
                                      f"{timeout_s:.0f}s; it receives no new work and its in-flight work still "
                                      "completes")
        return held

    def _observe(self, seq: _Seq, sample: SampleRecord) -> None:
        if sample.finish_reason == "interrupted" or not sample.token_ids:
            return
        with self._lock:
            self._lengths.add(len(sample.token_ids))
            if seq.estimate is not None:
                self._pairs.append((seq.estimate, float(len(sample.token_ids))))

    def results(self, call: RouterCall, is_active: Callable[[], bool] = lambda: True) -> Iterator[SampleRecord]:
        """The call's samples in completion order; raises ``InstanceFailed`` on an instance failure."""
        kind, open_calls = call.out.get()
        assert kind == "open"
        delivered = 0
        while open_calls:
            try:
                item = call.out.get(timeout=0.5)
            except queue.Empty:
                if not is_active():
                    call.cancel()
                    return
                continue
            if item is _END:
                open_calls -= 1
                continue
            if isinstance(item, BaseException):
                call.cancel()
                if isinstance(item, (InstanceFailed, RuntimeError)):
                    raise item
                raise RuntimeError(f"routing failed: {item!r}") from item
            delivered += 1
            yield item
        if delivered != call.expected:
            raise RuntimeError(f"instances returned {delivered} of {call.expected} samples")
        self._log_event({"event": "done", "call": call.call_id, "t": time.time(), "samples": delivered})

    # ------------------------------------------------------------------ health, timeline
    def health(self) -> HealthSnapshot:
        snaps = [c.health() for c in self.active_clients()]
        return HealthSnapshot(
            status="draining" if any(s.status == "draining" for s in snaps) else "serving",
            weight_version=min(s.weight_version for s in snaps),
            pending_version=max(s.pending_version for s in snaps),
            running=sum(s.running for s in snaps),
            waiting=sum(s.waiting for s in snaps),
            finished=sum(s.finished for s in snaps),
            kv_usage=sum(s.kv_usage for s in snaps) / len(snaps),
            engine=f"router[{len(snaps)} x {snaps[0].engine}]",
            generated_tokens=sum(s.generated_tokens for s in snaps),
        )

    def _log_event(self, row: dict) -> None:
        if self._timeline is None:
            return
        line = json.dumps(row) + "\n"
        with self._timeline_lock:
            self._timeline.write(line)

    def close(self) -> None:
        if self._timeline is not None:
            with self._timeline_lock:
                self._timeline.close()
                self._timeline = None
