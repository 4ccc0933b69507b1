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
3. joins the current routing round (below), whose sequences are planned together; splits them by
   the pool their task maps to (``scheduling.pools``, RollArt's
   hardware affinity; one pool of every live instance without ``generation.affinity``) and
   asks the configured dispatch policy (a pure function from ``scheduling.dispatch``) for a
   plan per pool over that pool's instances, given their outstanding work, the recent length
   distribution, the estimator's recent errors (estimate -> actual pairs of finished samples)
   and the PTL profile's cost model; a task with no instance routed to in its pool is refused
   (``AffinityError``: FAILED_PRECONDITION at the edge) before anything is dispatched;
4. sends each instance its share as one Generate call (one sequence per wire prompt,
   ``prompt_id/sample_index``, estimates attached so the instance admits them LPT) and
   merges the instances' streams into the caller's stream in completion order, restoring
   the caller's prompt ids and sample indices;
5. logs a per-instance timeline (JSONL): one line per dispatched call (with its pools) and per
   finished sample (with its task and the instance's pool).

**Routing rounds** (``generation.dispatch.gather_s``; StreamRL §4, Algorithm 2 plans a batch). The
rollout orchestrator sends one Generate call per GRPO group, a routing round's groups back to back,
so a router that planned each call alone would show the policy one prompt's samples at a time and
never a batch's long tail. The first call to arrive opens a round and leads it: it waits
``gather_s`` (default 20 ms), closes the round, and runs the policy once (per pool) over the
sequences of every call that joined, on one snapshot of the rows, then books them all; each call
then sends its own share and streams its own samples, as before. Why a window at the router rather
than one Generate call carrying the round's groups: a call is the unit of cancellation and failure,
and the orchestrator cancels single groups (a group complete with redundant samples still running,
DAPO's filter, a group dropped by the staleness bound), which a shared stream could not do without
cancelling its neighbours. Here a cancelled or failed call releases only its own samples; a call
refused on its own (its task has no pool, only lost instances may run it) gets its error while the
rest of its round goes on. A call that misses the window is planned in the next round, on a
snapshot that holds the earlier round's bookings. ``gather_s = 0`` plans every call alone.

``UpdateWeights`` is forwarded to every instance (``fanout.WeightFanout``); ``Health``
aggregates the instances'. Mechanism only: every decision is the policy's.

Instance state is a ``services.rollout.fleet.Fleet`` (docs/fleet.md) kept by ``RouterMembers``
(``router_members.py``: joins, removals, losses, readmission): one row per instance, its index the
instance's slot (never reused: in-flight calls keep it), ``clients[i]`` its connection. A dispatch
plans on one snapshot (``context``: each row's booked sequences and estimated work) and books every
sequence on its row (``reserve``), released when the sample returns, fails or is cancelled; a row
that stopped taking work in between refuses the booking and the request is planned again without
it, so a removal never waits for a dispatch. Policies see only a pool's live rows, numbered
densely; the plan is mapped back to slots. A call failing UNAVAILABLE marks its instance lost (no
new work until a weight version reaches it again); a request that only lost instances may run
fails UNAVAILABLE.
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
from services.common.types import GenerateParams, PromptSpec, SampleRecord
from services.generation.client import GenerateCall, GenerationClient
from services.generation.router_members import ROUTED, RouterMembers
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
    AffinityError,
    PoolShare,
    hardware_of_pool,
    merge_plans,
    pool_of_instance,
    split_by_pool,
)
from services.rollout.fleet import FleetSnapshot, Instance, Reservation

log = logging.getLogger("braid.router")


EstimatorProvider = Callable[[], "LengthEstimator | None"]  # called per request: hot-swapped rankers


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
    call: int = 0  # the Generate call it belongs to (a routing round plans several calls' sequences)
    instance: int = -1
    booked: Reservation | None = None  # its sample on its instance's row, until it returns

    @property
    def key(self) -> str:
        """Its id in a routing round's plan (two calls of a round may send the same prompt id)."""
        return f"{self.call}:{self.wire_id}"


@dataclass
class _Pending:
    """One Generate call waiting in a routing round for its share of the round's plan."""

    call_id: int
    seqs: list[_Seq]
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None  # its own refusal (affinity, lost instances), or the round's failure
    plan: DispatchPlan | None = None  # the round's plan (every member's sequences, by ``_Seq.key``)
    parts: list[tuple[PoolShare, DispatchPlan]] = field(default_factory=list)
    t_dispatch: float = 0.0
    dispatch_s: float = 0.0
    members: int = 1  # calls in the round
    sequences: int = 0  # sequences in the round
    leader: int = 0  # the round's first call (its id names the round in the timeline)
    slots: int = 0  # rows in the snapshot the round was planned on


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
        self.cfg = cfg
        self.dcfg = cfg.dispatch
        self.spec = spec
        self.estimator = estimator
        self.decode = decode
        self.estimator_name = estimator_name  # which ranker answered (the store name), for the timeline
        # open for the router's life (line-buffered appends from many threads); close() closes it
        self._timeline = Path(timeline_path).open("a", buffering=1) if timeline_path else None  # noqa: SIM115
        self._timeline_lock = threading.Lock()
        self.members = RouterMembers(clients, cfg, self._log_event)
        self.fleet, self.clients = self.members.fleet, self.members.clients  # the rows, their connections
        self._stats = threading.Lock()  # the recent lengths and estimate pairs
        self._lengths = LengthWindow(self.dcfg.length_window)
        self._pairs: deque[tuple[float, float]] = deque(maxlen=self.dcfg.length_window)
        self._calls = itertools.count()
        self.estimator_failures = 0
        self._round_lock = threading.Lock()
        self._round: list[_Pending] | None = None  # the open routing round's calls (its leader waits gather_s)

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
    def context(self, rows: Sequence[Instance], seed: int) -> DispatchContext:
        """The dispatch view of ``rows`` (one pool's live rows, from one snapshot), numbered 0..n-1
        (``rows[k]`` is instance ``k``)."""
        states = [self.clients[r.index].kv_state() for r in rows] if self.dcfg.policy == "least_tokens" else None
        kv_tokens = self.cfg.num_blocks * self.cfg.page_size
        with self._stats:
            dist = self._lengths.distribution(self.dcfg.min_history)
            pairs = list(self._pairs)
        mean = dist.mean() if dist is not None else 0.0
        loads = tuple(InstanceLoad(k, r.inflight, r.work,
                                   0.0 if states is None else tokens_in_flight(states[k], kv_tokens, r.inflight, mean))
                      for k, r in enumerate(rows))
        errors = EstimateErrorModel(pairs) if len(pairs) >= self.dcfg.min_history else None
        return DispatchContext(
            instances=loads, spec=self.spec, lengths=dist, alpha=self.dcfg.alpha, admission=self.cfg.admission,
            errors=errors, scenarios=self.dcfg.scenarios, seed=seed,
            rotation=min(range(len(loads)), key=lambda i: (loads[i].outstanding, i)), unit=self.dcfg.unit,
        )

    def _plan(self, seqs: list[_Seq], snap: FleetSnapshot, seed: int) -> list[tuple[PoolShare, DispatchPlan]]:
        """The dispatch policy once per pool over that pool's live rows in ``snap`` (all live rows
        without affinity); each pool's plan numbers its rows densely and names sequences by ``_Seq.key``."""
        parts = []
        for pool in self._split(seqs, snap):
            share = [seqs[k] for k in pool.members]
            requests = [SeqRequest(s.key, len(s.prompt.token_ids), s.estimate, group=f"{s.call}:{s.prompt.prompt_id}")
                        for s in share]
            ctx = self.context([snap[i] for i in pool.slots], seed)
            parts.append((pool, dispatch(self.dcfg.policy, requests, ctx)))
        return parts

    def _split(self, seqs: list[_Seq], snap: FleetSnapshot) -> list[PoolShare]:
        """The request's sequences by pool over the live rows. Raises ``AffinityError`` for a task no
        instance routed to may run, ``InstanceFailed`` (UNAVAILABLE) when only lost ones could."""
        tasks = [s.prompt.task for s in seqs]
        try:
            return split_by_pool(tasks, self.cfg, snap.live())
        except AffinityError:
            split_by_pool(tasks, self.cfg, snap.in_state(*ROUTED))  # the request's own affinity error
            lost = snap[snap.in_state("lost")[0]]
            raise InstanceFailed(lost.index, lost.address, grpc.StatusCode.UNAVAILABLE,
                                 f"lost ({lost.why}); no live instance may run this request") from None

    def _book(self, seqs: list[_Seq], plan: DispatchPlan) -> bool:
        """Book each sequence on its planned row (one sample, its estimate as work). False, nothing
        left booked, when a row stopped taking work since the snapshot the plan was made on."""
        for k, s in enumerate(seqs):
            s.instance = plan.assignment[s.key]
            s.booked = self.fleet.reserve(s.instance, 1, over=True, work=s.estimate or 0.0)
            if s.booked is None:
                for done in seqs[:k]:
                    self.fleet.release(done.booked)
                return False
        return True

    # ------------------------------------------------------------------ routing rounds
    def _join_round(self, me: _Pending) -> None:
        """Return once ``me`` has its share of its routing round's plan (or its ``error``). The first
        call to arrive leads the round: it waits ``gather_s``, closes the round and plans every call
        that joined meanwhile; the others wait for it."""
        if self.dcfg.gather_s <= 0:
            self._plan_round([me])
            return
        with self._round_lock:
            lead = self._round is None
            if lead:
                self._round = []
            self._round.append(me)
        if not lead:
            me.done.wait()  # the leader sets it whatever happens (``_plan_round``'s finally)
            return
        time.sleep(self.dcfg.gather_s)
        with self._round_lock:
            members, self._round = self._round, None
        self._plan_round(members)

    def _plan_round(self, members: list[_Pending]) -> None:
        """Plan the members' sequences together (one dispatch call per pool over all of them) and book
        them. A member whose own request cannot run (its task has no pool, or only lost instances may
        run it) gets its error and the rest go on; if planning itself fails every member gets that error.
        Every member's ``done`` is set on return."""
        try:
            while True:  # a row left between the snapshot and the booking: plan again without it
                t_dispatch = time.time()  # before the snapshot: a removal logged earlier was planned without its row
                t0 = time.perf_counter()
                snap = self.fleet.snapshot()
                going = []
                for m in members:
                    try:
                        self._split(m.seqs, snap)  # its own refusal, as a call planned alone would get
                    except (AffinityError, InstanceFailed) as err:
                        m.error = err
                    else:
                        m.error = None
                        going.append(m)
                if not going:
                    return
                seqs = [s for m in going for s in m.seqs]
                parts = self._plan(seqs, snap, going[0].call_id)
                plan = merge_plans(parts)
                dispatch_s = time.perf_counter() - t0
                if self._book(seqs, plan):
                    break
            for m in going:
                m.plan, m.parts, m.t_dispatch, m.dispatch_s = plan, parts, t_dispatch, dispatch_s
                m.members, m.sequences, m.leader, m.slots = len(going), len(seqs), going[0].call_id, len(snap)
        except BaseException as exc:  # noqa: BLE001 - raised in each member's own start()
            for m in members:
                if m.plan is None and m.error is None:
                    m.error = exc
        finally:
            for m in members:
                m.done.set()

    def start(self, prompts: list[PromptSpec], params: GenerateParams) -> RouterCall:
        """Dispatch a validated request within its routing round and start one Generate call per
        instance that got work. Raises ``AffinityError`` (nothing dispatched) when a prompt's task has
        no instance routed to, ``InstanceFailed`` (UNAVAILABLE) when its instances are all lost."""
        est, source = self.estimates(prompts)
        call_id = self.dcfg.seed + next(self._calls)
        seqs = [_Seq(f"{p.prompt_id}/{k}", p, k, e, call_id)
                for p, e in zip(prompts, est, strict=True) for k in range(params.samples_per_prompt)]
        me = _Pending(call_id, seqs)
        self._join_round(me)
        if me.error is not None:
            raise me.error
        plan = me.plan
        own = {s.key: s.wire_id for s in seqs}
        call = RouterCall(call_id, len(seqs), replace(
            plan, assignment={s.wire_id: s.instance for s in seqs},
            long_tail=frozenset(own[k] for k in plan.long_tail if k in own)), source)
        shares: list[list[_Seq]] = [[] for _ in range(me.slots)]
        for s in seqs:
            shares[s.instance].append(s)
        self._log_event({
            "event": "dispatch", "call": call.call_id, "tag": params.tag, "t": me.t_dispatch, "policy": plan.policy,
            "sequences": len(seqs), "per_instance": [len(s) for s in shares], "estimates": source,
            "ranker": self.estimator_name() if self.estimator_name and source in ("estimator", "mixed") else None,
            "round": me.leader, "round_calls": me.members, "round_sequences": me.sequences,
            "dispatch_s": me.dispatch_s, "predicted_makespan_s": plan.predicted_makespan_s, "notes": plan.notes,
            "long_instances": list(plan.long_instances),
            "pools": [{"pool": pool.pool, "hardware": hardware_of_pool(pool.pool, self.cfg), "tasks": list(pool.tasks),
                       "instances": list(pool.slots), "sequences": len(pool.members),
                       "predicted_makespan_s": part.predicted_makespan_s} for pool, part in me.parts],
        })
        self._send(call, shares, params)
        return call

    def _send(self, call: RouterCall, shares: list[list[_Seq]], params: GenerateParams) -> None:
        """One Generate call per instance with a share, each read on its own thread."""
        # a seeded call's seed goes along: each instance seeds a sample by its wire id (<prompt>/<k>),
        # so the sample is the same wherever the dispatch puts it
        wire_params = replace(params, samples_per_prompt=1)
        forward = self.dcfg.forward_estimates
        call.out.put(("open", sum(1 for share in shares if share)))
        for i, share in enumerate(shares):
            if not share:
                continue
            wire = [
                PromptSpec(s.wire_id, s.prompt.token_ids, s.prompt.group, (s.estimate or 0.0) if forward else 0.0,
                           s.prompt.forced_for(s.sample_index), s.prompt.task)
                for s in share
            ]
            handle = self.clients[i].start(wire, wire_params)
            call.handles.append(handle)
            threading.Thread(
                target=self._read, args=(call, i, handle, {s.wire_id: s for s in share}),
                name=f"route-{call.call_id}-{i}", daemon=True,
            ).start()

    def _read(self, call: RouterCall, i: int, handle: GenerateCall, pending: dict[str, _Seq]) -> None:
        epoch = next(iter(pending.values())).booked.epoch  # the incarnation the share was booked in
        try:
            for sample in handle:
                seq = pending.pop(sample.prompt_id)
                self.fleet.release(seq.booked)
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
                if err.code() == grpc.StatusCode.UNAVAILABLE:
                    self.members.lost(i, epoch, err.details() or str(err))
                call.out.put(InstanceFailed(i, self.clients[i].address, err.code(), err.details() or str(err)))
        except BaseException as exc:  # noqa: BLE001 - surfaced to the caller
            call.out.put(exc)
        finally:
            for seq in pending.values():  # never returned (failure or cancel): no longer outstanding
                self.fleet.release(seq.booked)

    def _observe(self, seq: _Seq, sample: SampleRecord) -> None:
        if sample.finish_reason == "interrupted" or not sample.token_ids:
            return
        with self._stats:
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

    # ------------------------------------------------------------------ timeline
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
