"""Property tests of the staleness manager over random interleavings of events.

A hypothesis state machine plays rollout instances and a trainer against one manager: start
(route a trajectory to an instance at its version if the discriminator allows), finish
(Occupy), abort, interrupt (partial rollout: the instance takes new weights mid-trajectory),
consume, and weight-version events (an instance installs the trainer's newest version). After
every step it checks the protocol's guarantees.
"""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from services.rollout.staleness import StalenessError, StalenessManager


def head_could_be_ready(mgr: StalenessManager) -> bool:
    """Is there *any* legal placement of the tracked entries with ``batch`` occupied entries in
    the head buffer? (Exact: put the ``batch`` occupied entries with the tightest deadlines in
    the head, then check the rest fit by earliest-deadline-first: entry e may sit in buffers
    head..V_e+eta, each buffer has ``capacity`` slots.)"""
    entries = list(mgr.tracked().values())
    occupied = sorted((e for e in entries if e.state == "occupied"), key=lambda e: e.version)
    if len(occupied) < mgr.batch:
        return False
    rest = occupied[mgr.batch :] + [e for e in entries if e.state == "reserved"]
    deadlines = sorted(e.version + mgr.eta for e in rest)
    return all(n <= (mgr.capacity - mgr.batch) + mgr.capacity * (d - mgr.head)
               for n, d in enumerate(deadlines, start=1))


class StalenessMachine(RuleBasedStateMachine):
    @initialize(
        eta=st.integers(0, 3),
        batch=st.integers(1, 3),
        redundancy=st.integers(0, 1),
        instances=st.integers(1, 3),
        async_bound=st.one_of(st.none(), st.integers(0, 3)),
    )
    def setup(self, eta, batch, redundancy, instances, async_bound):
        self.mgr = StalenessManager(eta, batch, redundancy=redundancy, async_bound=async_bound)
        self.instance_version = [0] * instances
        self.ids = itertools.count()
        self.started: dict[str, int] = {}  # key -> version it started with
        self.consumed: dict[str, int] = {}  # key -> buffer version it trained in
        self.aborted: set[str] = set()

    def _keys(self, state: str | None = None) -> list[str]:
        return sorted(k for k, e in self.mgr.tracked().items() if state is None or e.state == state)

    @rule(i=st.integers(0, 2))
    def start(self, i):
        v = self.instance_version[i % len(self.instance_version)]
        key = f"t{next(self.ids)}"
        if self.mgr.can_reserve(v):
            b = self.mgr.reserve(key, v)
            assert max(v, self.mgr.head) <= b <= v + self.mgr.eta
            self.started[key] = v
        else:
            try:
                self.mgr.reserve(key, v)
            except StalenessError:
                return
            raise AssertionError("reserve succeeded where the discriminator refused")

    @precondition(lambda self: any(e.state == "reserved" for e in self.mgr.tracked().values()))
    @rule(pick=st.integers(0, 10**6), newer=st.integers(0, 2))
    def finish(self, pick, newer):
        keys = self._keys("reserved")
        key = keys[pick % len(keys)]
        v = self.mgr.entry(key).version
        self.mgr.occupy(key, generated_version=min(v + newer, self.mgr.head))

    @precondition(lambda self: bool(self.mgr.tracked()))
    @rule(pick=st.integers(0, 10**6))
    def abort(self, pick):
        keys = self._keys()
        key = keys[pick % len(keys)]
        self.mgr.abort(key, "test")
        self.aborted.add(key)

    @precondition(lambda self: any(e.state == "reserved" for e in self.mgr.tracked().values()))
    @rule(pick=st.integers(0, 10**6))
    def interrupt(self, pick):
        # partial rollout: the trajectory continues on newer weights; its entry must not change
        keys = self._keys("reserved")
        key = keys[pick % len(keys)]
        before = (self.mgr.location(key), self.mgr.entry(key).version)
        self.instance_version = [self.mgr.head] * len(self.instance_version)
        assert (self.mgr.location(key), self.mgr.entry(key).version) == before

    @rule(i=st.integers(0, 2))
    def weights(self, i):
        self.instance_version[i % len(self.instance_version)] = self.mgr.head

    @rule()
    def consume(self):
        if not self.mgr.ready():
            try:
                self.mgr.consume()
            except StalenessError:
                return
            raise AssertionError("consumed a buffer that was not ready")
        result = self.mgr.consume()
        assert len(result.entries) == self.mgr.batch
        for e in result.entries:
            assert e.version + self.mgr.eta >= e.buffer_version, "staleness bound violated"
            assert e.key not in self.consumed, "consumed twice"
            assert e.inherent_staleness >= 0
            self.consumed[e.key] = e.buffer_version
        for a in result.aborted:
            self.aborted.add(a.key)

    @invariant()
    def bound_holds_for_every_tracked_entry(self):
        if not hasattr(self, "mgr"):
            return
        for key, e in self.mgr.tracked().items():
            b = self.mgr.location(key)
            assert self.mgr.head <= b <= e.version + self.mgr.eta, (key, e, b)

    @invariant()
    def nothing_lost_or_duplicated(self):
        if not hasattr(self, "mgr"):
            return
        tracked = set(self.mgr.tracked())
        consumed, aborted = set(self.consumed), self.aborted
        assert not (tracked & consumed) and not (tracked & aborted) and not (consumed & aborted)
        assert tracked | consumed | aborted == set(self.started)

    @invariant()
    def ready_whenever_possible(self):
        if not hasattr(self, "mgr"):
            return
        assert self.mgr.ready() == head_could_be_ready(self.mgr), self.mgr.tracked()

    @invariant()
    def states_are_consistent(self):
        if not hasattr(self, "mgr"):
            return
        slots = self.mgr.buffer(self.mgr.head)
        state = self.mgr.state(self.mgr.head)
        occupied = sum(1 for e in slots if e is not None and e.state == "occupied")
        if state == "stuck":
            assert None not in slots and occupied < self.mgr.batch
        if state == "waiting":
            assert None in slots and occupied < self.mgr.batch


TestStaleness = StalenessMachine.TestCase
TestStaleness.settings = settings(
    max_examples=300, stateful_step_count=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
