"""The one table of SGS instances (state only: no I/O, no threads of its own).

One row per instance a run has known, in join order; a row's index never changes (a removed
instance keeps its row, so indices held by callers stay valid). A row holds:

- **membership and health**: ``joining`` (has a row, waits for the newest weights; not routable),
  ``live`` (takes new work), ``draining`` (leaving: no new work, what it holds completes),
  ``lost`` (its process went away; it may come back through ``mark_live``), ``removed`` (drained
  and released; final);
- **address, site and pool** (RollArt's hardware affinity: ``generation.pools``);
- **weight version**: ``version`` is the version new work there runs with (the weights offered to
  it, what routing uses), ``staged`` the newest it acknowledged; both only grow within an
  incarnation;
- **capacity and load**: ``capacity`` (most samples in flight), ``inflight`` (samples reserved or
  running), ``incoming`` (samples a repack is moving there), ``work`` (estimated output tokens
  outstanding, for the dispatch policies: booked with the samples, ``reserve(work=)``, and released
  with them, so a loss zeroes it and a late release cannot touch the next incarnation), ``placed``
  (picks counted: ``acquire`` by default, ``reserve`` when asked);
- **epoch**: the incarnation, bumped whenever the instance is lost or comes back. A reservation
  carries the epoch it was made in; releasing it in a later epoch does nothing (the loss already
  zeroed that load), so a call that returns after its instance was lost and readmitted cannot
  drive the new incarnation's load below what it holds.

Every change is a method that takes the table's lock; every read is a ``FleetSnapshot``, an
immutable copy made under the lock (rows are frozen dataclasses in a tuple), so a reader never sees
a row list of one length and a version list of another (the class of bug ``ac10530`` fixed).
``acquire`` picks and reserves under one hold of the lock with ``routing.pick_instance`` (the same
staleness-aware policy every workflow uses): two pickers can never both take the last room on an
instance. A caller that planned on a snapshot (a dispatch policy) books with ``reserve``, which
checks again and answers None when the instance filled or left in between.

``can_reserve`` (the staleness manager's) is called under the table's lock: it must not call back
into the table. The lock orders after any lock a caller holds while calling the table.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Literal

from services.rollout.routing import CanReserve, InstanceView, pick_instance

State = Literal["joining", "live", "draining", "lost", "removed"]
ROUTABLE: frozenset[str] = frozenset({"live"})
HOLDS_WORK: frozenset[str] = frozenset({"live", "draining"})  # what a weight version must still reach


class FleetError(ValueError):
    """A change the table refuses (an unknown index, a duplicate address, a wrong state)."""


@dataclass(frozen=True)
class Instance:
    """One row, as a snapshot saw it."""

    index: int
    address: str
    state: State
    capacity: int
    version: int = -1  # the version new work here runs with (offered weights); -1: not known yet
    staged: int = -1  # the newest version the instance acknowledged
    inflight: int = 0
    incoming: int = 0
    work: float = 0.0
    placed: int = 0
    pool: str | None = None
    site: str = ""
    epoch: int = 0
    why: str = ""  # why it was last lost

    @property
    def load(self) -> int:
        """Samples counted against its capacity: in flight plus those a repack moves here."""
        return self.inflight + self.incoming

    def view(self) -> InstanceView:
        """What ``routing.pick_instance`` and the dispatch policies read."""
        return InstanceView(self.index, self.version, self.load, self.capacity, self.state in ROUTABLE, self.work)


@dataclass(frozen=True)
class Reservation:
    """Samples booked on one instance by ``acquire`` or ``reserve``; hand it back to ``release``."""

    index: int
    samples: int
    version: int  # the instance's version when booked (a new trajectory's V_traj)
    epoch: int
    work: float = 0.0  # estimated output tokens per sample, counted in the row's ``work`` while booked


@dataclass(frozen=True)
class FleetSnapshot:
    """The whole table at one moment; ``revision`` counts the changes made before it."""

    rows: tuple[Instance, ...]
    revision: int

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> Instance:
        return self.rows[i]

    def views(self) -> list[InstanceView]:
        """One view per row, index order (non-routable rows are ``alive=False``)."""
        return [r.view() for r in self.rows]

    def live(self) -> list[int]:
        return [r.index for r in self.rows if r.state in ROUTABLE]

    def in_state(self, *states: State) -> list[int]:
        return [r.index for r in self.rows if r.state in states]

    def by_address(self, address: str) -> Instance | None:
        """The newest row at ``address`` that is not removed."""
        return next((r for r in reversed(self.rows) if r.address == address and r.state != "removed"), None)

    def in_pools(self, pools: Collection[str]) -> list[int]:
        return [r.index for r in self.rows if r.pool in pools]


class Fleet:
    """The table (see the module docstring). Thread-safe; snapshots are immutable."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise FleetError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity  # a joining row's capacity unless it names its own
        self._rows: list[Instance] = []
        self._revision = 0
        self._losses = 0
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)

    # ------------------------------------------------------------------ reads
    def snapshot(self) -> FleetSnapshot:
        with self._lock:
            return FleetSnapshot(tuple(self._rows), self._revision)

    def views(self) -> list[InstanceView]:
        return self.snapshot().views()

    def live(self) -> list[int]:
        return self.snapshot().live()

    def __len__(self) -> int:
        with self._lock:
            return len(self._rows)

    @property
    def losses(self) -> int:
        """Times a routable or joining instance was lost."""
        with self._lock:
            return self._losses

    # ------------------------------------------------------------------ membership and health
    def join(self, address: str, *, live: bool = False, version: int = -1, capacity: int | None = None,
             pool: str | None = None, site: str = "") -> int:
        """A new row (``joining``, or ``live`` at ``version`` for an instance present from the start);
        its index. Raises ``FleetError`` for an address another row still holds."""
        if capacity is not None and capacity < 1:
            raise FleetError(f"{address}: capacity must be at least 1, got {capacity}")
        with self._lock:
            held = [r.index for r in self._rows if r.address == address and r.state != "removed"]
            if held:
                raise FleetError(f"{address} already has row {held[0]}")
            i = len(self._rows)
            self._rows.append(Instance(i, address, "live" if live else "joining", capacity or self.capacity,
                                       version=version, staged=version, pool=pool, site=site))
            self._touch()
            return i

    def mark_live(self, i: int, version: int) -> None:
        """A joining or lost instance serves again at ``version`` (staged there): a new incarnation
        with nothing in flight."""
        with self._lock:
            row = self._row(i, "joining", "lost")
            self._put(replace(row, state="live", version=version, staged=version, inflight=0, incoming=0,
                              work=0.0, epoch=row.epoch + 1))

    def mark_lost(self, i: int, why: str = "", *, epoch: int | None = None) -> bool:
        """Instance ``i`` is gone: nothing runs there any more; False when it was lost (or gone) already,
        or, with ``epoch``, when the failure was seen in an earlier incarnation than the row's (a weight
        push or call that began before a loss and readmission does not lose the new incarnation)."""
        with self._lock:
            row = self._row(i)
            if row.state in ("lost", "removed") or (epoch is not None and row.epoch != epoch):
                return False
            self._losses += 1
            self._put(replace(row, state="lost", inflight=0, incoming=0, work=0.0, epoch=row.epoch + 1, why=why))
            return True

    def drain(self, i: int) -> int:
        """Instance ``i`` leaves: no new work, what it holds completes; the samples it holds now."""
        with self._lock:
            row = self._row(i, "live", "joining", "draining")
            self._put(replace(row, state="draining"))
            return row.inflight

    def remove(self, i: int) -> None:
        """Release a drained (or lost) instance's row for good. Raises while it still holds work."""
        with self._lock:
            row = self._row(i, "draining", "lost")
            if row.inflight:
                raise FleetError(f"instance {i} ({row.address}) still holds {row.inflight} samples")
            self._put(replace(row, state="removed"))

    def wait_drained(self, i: int, timeout_s: float) -> bool:
        """Block until instance ``i`` holds nothing (or ``timeout_s`` passed); whether it drained."""
        with self._changed:
            return self._changed.wait_for(lambda: self._rows[i].inflight == 0, timeout=timeout_s)

    # ------------------------------------------------------------------ weights
    def record_version(self, i: int, version: int, *, staged: bool = False) -> bool:
        """Instance ``i`` was offered ``version`` (``staged``: it acknowledged it). Versions only grow.
        False, and nothing recorded, when the instance is lost or removed by now: a sync that raced a
        loss neither revives it nor gives its next incarnation a version it never staged."""
        with self._lock:
            row = self._row(i)
            if row.state in ("lost", "removed"):
                return False
            new = replace(row, version=max(row.version, version))
            if staged:
                new = replace(new, staged=max(row.staged, version))
            if new != row:
                self._put(new)
            return True

    # ------------------------------------------------------------------ capacity and load
    def acquire(self, v_traj: int | None, can_reserve: CanReserve, need: int = 1, *,
                eligible: Collection[int] | None = None, pools: Collection[str] | None = None,
                prefer: int | None = None, slack: int = 0, count: bool = True) -> Reservation | None:
        """Pick with ``routing.pick_instance`` and book ``need`` samples there, atomically; None when
        no live instance has room (and, for ``v_traj``, a routable version). ``pools``: only the rows of
        these pools (affinity), intersected with ``eligible``; ``count``: counted in ``placed``."""
        with self._lock:
            allowed = self._allowed(eligible, pools)
            inst = pick_instance(v_traj, [r.view() for r in self._rows], can_reserve, need, allowed, prefer, slack)
            if inst is None:
                return None
            return self._book(self._rows[inst.index], need, count)

    def reserve(self, i: int, need: int, *, min_version: int | None = None, over: bool = False,
                count: bool = False, work: float = 0.0) -> Reservation | None:
        """Book ``need`` samples on ``i`` chosen from an earlier snapshot; None when it is no longer live,
        has no room (unless ``over``: work the caller must place there, e.g. a planned migration) or is
        older than ``min_version``; ``count``: counted in ``placed`` (a group launched there); ``work``:
        each sample's estimated output tokens, outstanding on ``i`` until released (the dispatch policies)."""
        with self._lock:
            row = self._row(i)
            if row.state not in ROUTABLE or (min_version is not None and row.version < min_version):
                return None
            if not over and row.load + need > row.capacity:
                return None
            return self._book(row, need, count, work)

    def release(self, res: Reservation, samples: int | None = None) -> bool:
        """Hand back ``samples`` of ``res`` (all by default) and their estimated work; False (nothing
        changed) when the instance was lost or readmitted since it was booked."""
        n = res.samples if samples is None else samples
        if not 0 <= n <= res.samples:
            raise FleetError(f"release of {n} samples from a reservation of {res.samples}")
        with self._lock:
            row = self._row(res.index)
            if row.epoch != res.epoch:
                return False
            if n > row.inflight:
                raise FleetError(f"instance {res.index} holds {row.inflight} samples, {n} released")
            self._put(replace(row, inflight=row.inflight - n, work=max(0.0, row.work - n * res.work)))
            return True

    def rework(self, res: Reservation, outstanding: int, work: float) -> Reservation:
        """Re-estimate the ``outstanding`` samples ``res`` still books: ``work`` tokens each from now on
        (a group's finished siblings moved its estimate); returns the reservation to release them with
        (``res`` itself when the instance was lost or readmitted since)."""
        if not 0 <= outstanding <= res.samples or work < 0:
            raise FleetError(f"rework of {outstanding} samples of {res.samples} to {work} tokens each")
        with self._lock:
            row = self._row(res.index)
            if row.epoch != res.epoch:
                return res
            self._put(replace(row, work=max(0.0, row.work + outstanding * (work - res.work))))
            return replace(res, work=work)

    def set_incoming(self, counts: Mapping[int, int]) -> None:
        """Samples on their way to each instance (repack migrations); missing indices are 0."""
        with self._lock:
            for row in self._rows:
                n = int(counts.get(row.index, 0))
                if row.incoming != n and row.state in HOLDS_WORK:
                    self._put(replace(row, incoming=n))

    # ------------------------------------------------------------------ internals (lock held)
    def _allowed(self, eligible: Collection[int] | None, pools: Collection[str] | None) -> Collection[int] | None:
        if pools is None:
            return eligible
        in_pools = {r.index for r in self._rows if r.pool in pools}
        return in_pools if eligible is None else in_pools.intersection(eligible)

    def _book(self, row: Instance, need: int, count: bool, work: float = 0.0) -> Reservation:
        if need < 1 or work < 0:
            raise FleetError(f"a reservation needs at least one sample and no negative work, got {need}, {work}")
        self._put(replace(row, inflight=row.inflight + need, placed=row.placed + int(count),
                          work=row.work + need * work))
        return Reservation(row.index, need, row.version, row.epoch, work)

    def _row(self, i: int, *states: State) -> Instance:
        if not 0 <= i < len(self._rows):
            raise FleetError(f"no instance {i} (the table has {len(self._rows)})")
        row = self._rows[i]
        if states and row.state not in states:
            raise FleetError(f"instance {i} ({row.address}) is {row.state}, not {' or '.join(states)}")
        return row

    def _put(self, row: Instance) -> None:
        self._rows[row.index] = row
        self._touch()

    def _touch(self) -> None:
        self._revision += 1
        self._changed.notify_all()


def fleet_of(addresses: list[str], capacity: int, version: int = 0) -> Fleet:
    """A table of instances present from the start, each live at ``version``, in the given order."""
    fleet = Fleet(capacity)
    for address in addresses:
        fleet.join(address, live=True, version=version)
    return fleet


def evaluation_pick(fleet: Fleet, version: int, need: int) -> Reservation | None:
    """An evaluation share's pick on the run's own table: a live instance at ``version`` or newer with
    room for ``need`` samples beside the training work it holds; None while every one is full (the
    caller waits for a release) or older."""
    return fleet.acquire(version, _any_version, need, count=False)  # a share, not a group launched there


def _any_version(version: int) -> bool:
    """Evaluation reserves no staleness budget: only the instance's version (>= the evaluated one) counts."""
    return True
