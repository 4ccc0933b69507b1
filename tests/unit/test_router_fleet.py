"""The SGS router's instances on the fleet table (services.generation.router, router_members).

Fake instances stand in for the instance processes: a call answers when its instance does (at once,
a moment later, or when the test says). The races run on real threads: the router's reader thread
per call, a removal on its own thread, dispatchers on theirs. Waits that must not hang are bounded.
"""

from __future__ import annotations

import queue
import threading
import time

import grpc
import pytest

from services.common.config import load_config
from services.common.types import GenerateParams, HealthSnapshot, PromptSpec, SampleRecord
from services.generation.fanout import FanoutError, WeightFanout
from services.generation.router import InstanceFailed, RouterCore
from services.generation.router_members import MembershipError
from services.proto import braid_pb2 as pb
from tests.conftest import ROOT

WAIT_S = 10.0  # bound on waits that must not hang
_END = object()


class _Unavailable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "connection refused"


class FakeCall:
    """One Generate call on a fake instance: its samples once ``answer`` is called."""

    def __init__(self, prompts: list[PromptSpec]) -> None:
        self.prompts = prompts
        self.read: list[str] = []  # wire ids the router has read back
        self._items: queue.Queue = queue.Queue()

    def answer(self) -> None:
        for p in self.prompts:
            self._items.put(SampleRecord(p.prompt_id, p.group, 0, p.token_ids, (7, 7, 7), (0.0,) * 3, 0, "length",
                                         0.0, 0.0, 0.0))
        self._items.put(_END)

    def fail(self) -> None:
        self._items.put(_Unavailable())

    def cancel(self) -> None:
        self._items.put(_END)

    def __iter__(self):
        while (item := self._items.get(timeout=WAIT_S)) is not _END:
            if isinstance(item, BaseException):
                raise item
            self.read.append(item.prompt_id)
            yield item


class FakeInstance:
    """``answers``: "now" (in ``start``), "soon" (1 ms later, on a timer) or "" (when the test says)."""

    def __init__(self, address: str, *, answers: str = "now", kv: tuple[float, int] = (0.0, 0),
                 on_kv=None) -> None:
        self.address, self.answers, self.kv, self.on_kv = address, answers, kv, on_kv
        self.dead = False
        self.calls: list[FakeCall] = []

    def start(self, prompts: list[PromptSpec], params: GenerateParams) -> FakeCall:
        call = FakeCall(prompts)
        self.calls.append(call)
        if self.dead:
            call.fail()
        elif self.answers == "now":
            call.answer()
        elif self.answers == "soon":
            threading.Timer(0.001, call.answer).start()
        return call

    def kv_state(self) -> tuple[float, int]:
        if self.on_kv is not None:
            self.on_kv()
        return self.kv

    def health(self) -> HealthSnapshot:
        return HealthSnapshot("serving", 0, 0, 0, 0, 0, 0.0, "fake", 0)

    def pull_weights(self, version: int, wait_s: float) -> pb.UpdateAck:
        return pb.UpdateAck(version=version, staged=True)

    def sent(self) -> int:
        return sum(len(c.prompts) for c in list(self.calls))

    def read_back(self) -> int:
        return sum(len(c.read) for c in list(self.calls))


def _core(instances: list[FakeInstance], policy: str = "round_robin") -> RouterCore:
    cfg = load_config(ROOT / "deploy/configs/smoke.yaml", [f"generation.dispatch.policy={policy}"]).generation
    return RouterCore(instances, cfg)


def _prompts(tag: str, n: int) -> list[PromptSpec]:
    return [PromptSpec(f"{tag}{i}", (1, 5, 6, 7)) for i in range(n)]


def _run(core: RouterCore, prompts: list[PromptSpec], samples: int = 1) -> list[SampleRecord]:
    return list(core.results(core.start(prompts, GenerateParams(samples_per_prompt=samples))))


def _wait(done) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_an_instance_removed_while_a_dispatch_plans_on_it_gets_none_of_that_work():
    """The removal does not wait for a dispatch in progress: b leaves between the snapshot the
    dispatch planned on and its booking. The table refuses b's booking and the request is planned
    again over what is live, so b is never sent work once it left."""
    removals: list[int] = []

    def leave_now() -> None:  # the plan is reading b's load (least_tokens): b leaves right here
        if removals:
            return
        remover = threading.Thread(target=lambda: removals.append(core.members.remove_instance("b:2", WAIT_S)))
        remover.start()
        remover.join(WAIT_S)
        assert not remover.is_alive(), "the removal waited for the dispatch in progress"

    a, b = FakeInstance("a:1", kv=(0.9, 8)), FakeInstance("b:2", on_kv=leave_now)  # b looks idle: all to b
    core = _core([a, b], "least_tokens")
    call = core.start(_prompts("p", 4), GenerateParams(samples_per_prompt=2))
    samples = list(core.results(call))
    assert sorted((s.prompt_id, s.sample_index) for s in samples) == [(f"p{i}", k) for i in range(4) for k in range(2)]
    assert removals == [0] and b.calls == [] and set(call.plan.assignment.values()) == {0}
    assert [(r.state, r.inflight) for r in core.fleet.snapshot().rows] == [("live", 0), ("removed", 0)]
    assert core.members.addresses() == ["a:1"]


def test_a_removal_racing_dispatches_returns_once_everything_sent_to_the_instance_came_back(fine_switching):
    """Two dispatchers run calls over a and b (b answers 1 ms late) while b is removed: when the
    removal returns, b has answered every sequence it was ever sent, and it is sent nothing after."""
    a, b = FakeInstance("a:1"), FakeInstance("b:2", answers="soon")
    core = _core([a, b], "least_loaded")
    stop, errors, served = threading.Event(), [], []

    def dispatcher(tag: str) -> None:
        try:
            while not stop.is_set():
                prompts = _prompts(tag, 3)
                assert sorted(s.prompt_id for s in _run(core, prompts)) == [p.prompt_id for p in prompts]
                served.append(tag)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=dispatcher, args=(t,), daemon=True) for t in "xy"]
    for t in threads:
        t.start()
    _wait(lambda: b.sent() >= 20 or errors)
    held = core.members.remove_instance("b:2", WAIT_S)
    sent, read = b.sent(), b.read_back()
    before = len(served)
    _wait(lambda: len(served) >= before + 20 or errors)  # dispatch goes on without b
    stop.set()
    for t in threads:
        t.join(WAIT_S)
        assert not t.is_alive(), "a dispatcher hung"
    assert not errors, errors
    assert sent == read and b.sent() == sent and 0 <= held <= sent
    assert [(r.state, r.inflight, r.work) for r in core.fleet.snapshot().rows] == [("live", 0, 0.0),
                                                                                ("removed", 0, 0.0)]


def test_a_lost_instance_takes_no_new_work_and_its_late_samples_release_nothing():
    """b fails UNAVAILABLE on one call while it holds another: it is lost (load zeroed) and takes no
    new work; a weight version fanned out through the router takes it back as a new incarnation,
    and the samples its old call returns late do not reduce the new incarnation's load."""
    a, b = FakeInstance("a:1"), FakeInstance("b:2", answers="")
    core = _core([a, b])
    first = core.start(_prompts("x", 2), GenerateParams(samples_per_prompt=2))
    second = core.start(_prompts("y", 2), GenerateParams(samples_per_prompt=2))
    assert [len(c.prompts) for c in b.calls] == [2, 2]
    b.dead = True
    b.calls[0].fail()
    with pytest.raises(InstanceFailed) as err:
        list(core.results(first))
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    assert len(_run(core, _prompts("z", 3), 2)) == 6 and len(b.calls) == 2  # no new work for b
    lost = core.fleet.snapshot()[1]
    assert (lost.state, lost.inflight, lost.work) == ("lost", 0, 0.0)
    assert core.members.addresses() == ["a:1", "b:2"]  # still routed to: Health and weights reach it

    b.dead = False  # back; the next version reaches it through the router
    WeightFanout(core.members.weight_clients, on_staged=core.members.staged).pull(3, wait_s=1.0)
    back = core.fleet.snapshot()[1]
    assert (back.state, back.version, back.epoch) == ("live", 3, lost.epoch + 1)
    fourth = core.start(_prompts("w", 2), GenerateParams(samples_per_prompt=2))
    assert core.fleet.snapshot()[1].inflight == 2
    b.calls[1].answer()  # the old incarnation's call returns late
    assert len(list(core.results(second))) == 4
    assert core.fleet.snapshot()[1].inflight == 2  # nothing released on the new incarnation
    b.calls[2].answer()
    assert len(list(core.results(fourth))) == 4
    assert [(r.inflight, r.work) for r in core.fleet.snapshot().rows] == [(0, 0.0), (0, 0.0)]


def test_a_request_only_lost_instances_may_run_fails_unavailable():
    a = FakeInstance("a:1")
    core = _core([a])
    a.dead = True
    with pytest.raises(InstanceFailed):
        _run(core, _prompts("x", 1))
    with pytest.raises(InstanceFailed) as err:
        core.start(_prompts("y", 1), GenerateParams())
    assert err.value.code == grpc.StatusCode.UNAVAILABLE and "lost (connection refused)" in str(err.value)
    assert len(a.calls) == 1  # nothing was sent


def test_an_added_instance_takes_work_once_it_joined_and_a_failed_bring_up_frees_its_address():
    a, c = FakeInstance("a:1"), FakeInstance("c:3")
    core = _core([a])
    members = core.members

    def bring_up(client, join) -> int:
        with pytest.raises(MembershipError) as err:  # the address is claimed while it joins
            members.add_instance(FakeInstance("c:3"), bring_up)
        assert err.value.code == grpc.StatusCode.ALREADY_EXISTS
        assert len(_run(core, _prompts("j", 2))) == 2 and c.calls == []  # no work before it joined
        join(4)
        return 4

    assert members.add_instance(c, bring_up) == 4
    assert members.addresses() == ["a:1", "c:3"] and core.fleet.snapshot()[1].version == 4
    _run(core, _prompts("k", 4))
    assert c.calls

    def fails(client, join) -> int:
        raise FanoutError(-1, client.address, grpc.StatusCode.UNAVAILABLE, "no answer")

    with pytest.raises(FanoutError):
        members.add_instance(FakeInstance("d:4"), fails)
    assert members.add_instance(FakeInstance("d:4"), lambda client, join: join(5) or 5) == 5
    assert [r.state for r in core.fleet.snapshot().rows] == ["live", "live", "removed", "live"]
    assert [x.address for x in core.clients] == ["a:1", "c:3", "d:4", "d:4"]


# ---------------------------------------------------------------- routing rounds (generation.dispatch.gather_s)
def _round_core(instances: list[FakeInstance], policy: str = "round_robin", gather_s: float = 0.5,
                extra: tuple[str, ...] = ()) -> RouterCore:
    cfg = load_config(ROOT / "deploy/configs/smoke.yaml", [f"generation.dispatch.policy={policy}",
                                                          f"generation.dispatch.gather_s={gather_s}", *extra])
    return RouterCore(instances, cfg.generation)


def _spy_dispatch(monkeypatch) -> list[list]:
    """Record every call of the dispatch policy (the requests it was given) and run the real policy."""
    from services.generation import router as router_module

    seen: list[list] = []
    real = router_module.dispatch

    def spy(name, seqs, ctx):
        seen.append(list(seqs))
        return real(name, seqs, ctx)

    monkeypatch.setattr(router_module, "dispatch", spy)
    return seen


def _start_together(core: RouterCore, requests: list[tuple[list[PromptSpec], GenerateParams]]) -> list:
    """Start the requests on threads released at once (one call per GRPO group, as the orchestrator
    sends a routing round's groups); returns each one's RouterCall or the error it raised, in order."""
    out: list = [None] * len(requests)
    go = threading.Barrier(len(requests))

    def one(k: int) -> None:
        go.wait(WAIT_S)
        try:
            out[k] = core.start(*requests[k])
        except Exception as exc:  # noqa: BLE001 - checked by the test
            out[k] = exc

    threads = [threading.Thread(target=one, args=(k,), daemon=True) for k in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
        assert not t.is_alive(), "a call never returned from its routing round"
    return out


def test_the_policy_plans_every_group_of_a_routing_round_in_one_call(monkeypatch):
    """Four groups sent as four Generate calls within the window reach the dispatch policy as one
    batch of 4 x 2 sequences (Algorithm 2 sees the round's long tail), not as four plans of one
    group; each call still gets exactly its own samples, and every booking is released."""
    seen = _spy_dispatch(monkeypatch)
    a, b = FakeInstance("a:1"), FakeInstance("b:2")
    core = _round_core([a, b], "lpt")
    groups = [[PromptSpec(f"g{k}", (1, 5, 6, 7), estimated_length=10.0 * (k + 1))] for k in range(4)]
    calls = _start_together(core, [(g, GenerateParams(samples_per_prompt=2)) for g in groups])
    assert len(seen) == 1 and len(seen[0]) == 8
    assert sorted({s.group for s in seen[0]}) == sorted({f"{c.call_id}:g{k}" for k, c in enumerate(calls)})
    for k, call in enumerate(calls):
        samples = list(core.results(call))
        assert sorted((s.prompt_id, s.sample_index) for s in samples) == [(f"g{k}", 0), (f"g{k}", 1)]
        assert set(call.plan.assignment) == {f"g{k}/0", f"g{k}/1"}
    assert [(r.inflight, r.work) for r in core.fleet.snapshot().rows] == [(0, 0.0), (0, 0.0)]


def test_without_a_window_each_call_is_planned_on_its_own(monkeypatch):
    seen = _spy_dispatch(monkeypatch)
    core = _round_core([FakeInstance("a:1"), FakeInstance("b:2")], gather_s=0.0)
    calls = _start_together(core, [(_prompts(f"g{k}", 1), GenerateParams(samples_per_prompt=2)) for k in range(3)])
    assert [len(s) for s in seen] == [2, 2, 2]
    assert sum(len(list(core.results(c))) for c in calls) == 6


def test_a_cancelled_call_of_a_round_releases_only_its_own_samples():
    """Calls planned in one round stay separate calls: cancelling one releases its samples only; the
    others keep theirs booked until their instances answer."""
    a, b = FakeInstance("a:1", answers=""), FakeInstance("b:2", answers="")
    core = _round_core([a, b])
    calls = _start_together(core, [(_prompts(f"g{k}", 1), GenerateParams(samples_per_prompt=2)) for k in range(3)])
    assert sum(r.inflight for r in core.fleet.snapshot().rows) == 6
    calls[0].cancel()
    _wait(lambda: sum(r.inflight for r in core.fleet.snapshot().rows) == 4)
    time.sleep(0.05)  # nothing else is released
    assert sum(r.inflight for r in core.fleet.snapshot().rows) == 4
    for inst in (a, b):
        for c in inst.calls:
            if not c.read:
                c.answer()
    for call in calls[1:]:
        assert len(list(core.results(call))) == 2
    assert [r.inflight for r in core.fleet.snapshot().rows] == [0, 0]


def test_a_refused_call_of_a_round_does_not_stop_the_others():
    """A call whose task has no pool is refused (FAILED_PRECONDITION at the edge), as it would be on
    its own; the calls planned in the same round are served."""
    from services.generation.scheduling.pools import AffinityError

    a, b = FakeInstance("a:1"), FakeInstance("b:2")
    core = _round_core([a, b], extra=("generation.instances=2",
                                      "generation.pools=[{name: p, instances: [0]}, {name: q, instances: [1]}]",
                                      "generation.affinity={x: p, y: q}"))
    requests = [([PromptSpec("ok0", (1, 5), task="x")], GenerateParams(samples_per_prompt=2)),
                ([PromptSpec("bad", (1, 5), task="nope")], GenerateParams(samples_per_prompt=2)),
                ([PromptSpec("ok1", (1, 5), task="y")], GenerateParams(samples_per_prompt=2))]
    calls = _start_together(core, requests)
    assert isinstance(calls[1], AffinityError)
    assert [s.prompt_id for s in core.results(calls[0])] == ["ok0", "ok0"] and a.sent() == 2
    assert [s.prompt_id for s in core.results(calls[2])] == ["ok1", "ok1"] and b.sent() == 2
