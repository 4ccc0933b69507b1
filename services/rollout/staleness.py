"""StaleFlow's staleness manager (§4): virtual staleness buffers with Reserve / Occupy / Consume.

Every trajectory (or GRPO group: one entry per group, §4.3) carries a version identifier
``V_traj``: the oldest weight version allowed to produce any of its tokens. Training consumes
*virtual staleness buffers* in version order: buffer ``V_buf`` holds the entries trained on
while the model moves from ``V_buf`` to ``V_buf + 1``, and every entry in it must satisfy
``V_traj + eta >= V_buf``. The manager records only metadata (key, versions), at most
``(eta + 1) x capacity`` entries, independent of the cluster size.

Primitives:

- **Reserve** (a trajectory starts): scan backward from ``V_buf = V_traj + eta`` (the latest
  buffer it may still train in) down to ``V_traj`` and take the latest empty slot: the
  worst-case position, so the bound holds however long the trajectory runs.
- **Occupy** (it finished and was rewarded): delete its reserved entry, with *movement*: the
  earliest reserved entry B that may legally sit in the freed slot (``V_B + eta >= V_buf``)
  moves there, and the slot B left is refilled the same way from still earlier buffers; then
  the trajectory greedily takes the earliest empty slot. Finished entries gather in early
  buffers, reservations are pushed toward their worst case.
- **Consume** (training): only a Ready head buffer can be consumed; the head advances.
- **Abort** (redundancy surplus, filtering such as DAPO's all-equal-reward groups, RollArt's
  async bound, a trajectory given up): the slot is freed and refilled: occupied entries from
  later buffers move forward (and past reservations that may take their place, as in Occupy),
  reserved entries from earlier buffers move back, until nothing can move (each move lowers
  ``sum(occupied buffer) - sum(reserved buffer)``, so it ends).

Buffer states: **Waiting** (an empty slot remains, Reserve may continue), **Ready**
(``batch`` entries occupied: consumable), **Stuck** (full, but a reserved entry blocks it).
As a discriminator, ``can_reserve(v)`` simulates a Reserve: routing may start a trajectory at
version ``v`` only if it returns True (StaleFlow Algorithm 2).

Redundancy (§4.3): batch-level adds ``redundancy`` slots to every buffer (Ready at ``batch``
occupied; the surplus is aborted at Consume); group-level redundancy lives in the caller
(launch G + r samples, occupy when G finished, cancel the rest). Interrupts (partial
rollout) and migration do not change an entry: its ``V_traj`` is the oldest version.

For every consumed entry the manager reports RollArt's staleness ``V_buf - V_traj`` (at most
eta by construction; with ``async_bound = alpha`` tracked entries older than ``head - alpha``
are aborted when the head advances) and Laminar's inherent staleness ``M - K`` (trainer
version when the trajectory finished minus the version that generated it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

EntryState = Literal["reserved", "occupied"]
BufferState = Literal["waiting", "ready", "stuck"]


class StalenessError(ValueError):
    """A request that would break the protocol (bad arguments, unknown keys, not Ready)."""


@dataclass
class Entry:
    key: str
    version: int  # V_traj: the oldest version allowed for any token of the entry
    state: EntryState = "reserved"
    generated_version: int = -1  # the version that actually generated it (>= version)
    finish_version: int = -1  # the trainer's version when it was occupied (Laminar's M)


@dataclass(frozen=True)
class ConsumedEntry:
    key: str
    version: int
    buffer_version: int
    generated_version: int
    finish_version: int

    @property
    def staleness(self) -> int:
        """V_buf - V_traj: what the bound eta limits (RollArt's per-trajectory gap)."""
        return self.buffer_version - self.version

    @property
    def inherent_staleness(self) -> int:
        """Laminar's M - K: trainer version at finish minus the generating version."""
        return self.finish_version - self.generated_version


@dataclass(frozen=True)
class Aborted:
    key: str
    version: int
    state: EntryState
    reason: str


@dataclass(frozen=True)
class ConsumeResult:
    buffer_version: int
    entries: list[ConsumedEntry]
    aborted: list[Aborted]  # surplus of batch-level redundancy and async-bound victims


Slot = tuple[int, int]  # (buffer version, index)
Selector = Callable[[list[Entry], int], list[Entry]]


def first_occupied(entries: list[Entry], n: int) -> list[Entry]:
    """Default choice among a Ready buffer's occupied entries: slot order."""
    return entries[:n]


class StalenessManager:
    def __init__(
        self,
        eta: int,
        batch_size: int,
        group_size: int = 1,
        *,
        redundancy: int = 0,
        async_bound: int | None = None,
        start_version: int = 0,
        end_version: int | None = None,
    ) -> None:
        if eta < 0:
            raise StalenessError(f"eta must be >= 0 (got {eta})")
        if batch_size < 1 or group_size < 1:
            raise StalenessError(f"batch_size and group_size must be >= 1 (got {batch_size}, {group_size})")
        if batch_size % group_size:
            raise StalenessError(f"group size {group_size} does not divide the batch size {batch_size}")
        if redundancy < 0:
            raise StalenessError(f"redundancy must be >= 0 (got {redundancy})")
        if async_bound is not None and async_bound < 0:
            raise StalenessError(f"async_bound must be >= 0 (got {async_bound})")
        self.eta = eta
        self.batch = batch_size // group_size  # entries (groups) a buffer needs to be Ready
        self.capacity = self.batch + redundancy
        self.async_bound = async_bound
        self.head = start_version  # the oldest unconsumed buffer = the trainer's version
        # the run's last step trains buffer end_version - 1: no slot exists from end_version on, so no
        # trajectory starts that would never be trained
        self.end = end_version
        self._buffers: dict[int, list[Entry | None]] = {}
        self._where: dict[str, Slot] = {}

    # ------------------------------------------------------------------ queries
    def entry(self, key: str) -> Entry:
        if key not in self._where:
            raise StalenessError(f"unknown trajectory {key!r}")
        b, i = self._where[key]
        entry = self._buffers[b][i]
        assert entry is not None and entry.key == key
        return entry

    def location(self, key: str) -> int:
        """The buffer version the entry currently sits in."""
        self.entry(key)
        return self._where[key][0]

    def tracked_count(self) -> int:
        """How many groups are reserved or occupied (safe to read from another thread)."""
        return len(self._where)

    def tracked(self) -> dict[str, Entry]:
        return {k: self.entry(k) for k in self._where}

    def buffer(self, version: int) -> list[Entry | None]:
        """The slots of buffer ``version`` (a copy; empty slots are None)."""
        return list(self._slots(version))

    def state(self, version: int) -> BufferState:
        slots = self._slots(version)
        if sum(1 for e in slots if e is not None and e.state == "occupied") >= self.batch:
            return "ready"
        return "waiting" if any(e is None for e in slots) else "stuck"

    def ready(self) -> bool:
        return self.state(self.head) == "ready"

    def head_occupied(self) -> list[Entry]:
        """Occupied entries of the head buffer (final: they only leave by Consume or Abort)."""
        return [e for e in self._slots(self.head) if e is not None and e.state == "occupied"]

    def can_reserve(self, version: int) -> bool:
        """Discriminator: may a trajectory start now with ``V_traj = version``?"""
        self._check_version(version)
        return self._reserve_slot(version) is not None

    # ------------------------------------------------------------------ primitives
    def reserve(self, key: str, version: int) -> int:
        """Reserve the latest legal slot for a starting trajectory; return its buffer version."""
        self._check_version(version)
        if key in self._where:
            raise StalenessError(f"trajectory {key!r} is already tracked")
        slot = self._reserve_slot(version)
        if slot is None:
            raise StalenessError(
                f"no buffer in [{max(version, self.head)}, {version + self.eta}] has room for version {version} "
                f"(eta {self.eta}): the trajectory needs newer weights"
            )
        self._put(Entry(key, version), slot)
        return slot[0]

    def occupy(self, key: str, generated_version: int | None = None) -> int:
        """A reserved trajectory finished: move it to the earliest legal empty slot."""
        entry = self.entry(key)
        if entry.state != "reserved":
            raise StalenessError(f"trajectory {key!r} is already occupied")
        gen = entry.version if generated_version is None else generated_version
        if gen < entry.version:
            raise StalenessError(
                f"trajectory {key!r}: generated by version {gen} older than its V_traj {entry.version}"
            )
        self._refill_with_reserved(self._remove(key))
        entry.state, entry.generated_version, entry.finish_version = "occupied", gen, self.head
        slot = self._first_empty(self.head, entry.version + self.eta, prefer_unready=True)
        assert slot is not None, "movement always leaves a legal slot for the occupying entry"
        self._put(entry, slot)
        return slot[0]

    def abort(self, key: str, reason: str) -> Aborted:
        """Drop a tracked entry (reserved or occupied) and let other entries fill the gap."""
        entry = self.entry(key)
        self._settle(self._remove(key))
        return Aborted(key, entry.version, entry.state, reason)

    def consume(self, select: Selector = first_occupied) -> ConsumeResult:
        """Retire the Ready head buffer: ``batch`` occupied entries (chosen by ``select``)."""
        if not self.ready():
            raise StalenessError(f"buffer {self.head} is {self.state(self.head)}, not ready: it cannot be consumed")
        v_buf = self.head
        occupied = self.head_occupied()
        chosen = select(occupied, self.batch)
        if len(chosen) != self.batch or any(e not in occupied for e in chosen):
            raise StalenessError(
                f"selector returned {len(chosen)} entries, not {self.batch} occupied entries of buffer {v_buf}"
            )
        chosen_keys = {e.key for e in chosen}
        aborted = []
        for e in self._slots(v_buf):
            if e is not None:
                del self._where[e.key]
                if e.key not in chosen_keys:
                    aborted.append(Aborted(e.key, e.version, e.state, "redundant"))
        del self._buffers[v_buf]
        self.head += 1
        if self.async_bound is not None:
            for key, e in list(self.tracked().items()):
                if e.version < self.head - self.async_bound:
                    aborted.append(self.abort(key, "async_bound"))
        entries = [ConsumedEntry(e.key, e.version, v_buf, e.generated_version, e.finish_version) for e in chosen]
        return ConsumeResult(v_buf, entries, aborted)

    # ------------------------------------------------------------------ internals
    def _check_version(self, version: int) -> None:
        if version > self.head:
            raise StalenessError(f"version {version} is newer than the trainer's version {self.head}")
        if version < 0:
            raise StalenessError(f"version must be >= 0 (got {version})")

    def _slots(self, version: int) -> list[Entry | None]:
        if version < self.head:
            raise StalenessError(f"buffer {version} was already consumed (head is {self.head})")
        if version not in self._buffers:
            self._buffers[version] = [None] * self.capacity
        return self._buffers[version]

    def _versions(self, lo: int, hi: int) -> Iterator[int]:
        top = hi if self.end is None else min(hi, self.end - 1)
        return iter(range(max(lo, self.head), top + 1))

    def _reserve_slot(self, version: int) -> Slot | None:
        for b in reversed(list(self._versions(version, version + self.eta))):
            if self.state(b) == "ready":
                continue
            for i, e in enumerate(self._slots(b)):
                if e is None:
                    return b, i
        return None

    def _first_empty(self, lo: int, hi: int, *, prefer_unready: bool) -> Slot | None:
        fallback = None
        for b in self._versions(lo, hi):
            for i, e in enumerate(self._slots(b)):
                if e is None:
                    if not prefer_unready or self.state(b) != "ready":
                        return b, i
                    fallback = fallback or (b, i)
        return fallback

    def _put(self, entry: Entry, slot: Slot) -> None:
        self._slots(slot[0])[slot[1]] = entry
        self._where[entry.key] = slot

    def _remove(self, key: str) -> Slot:
        slot = self._where.pop(key)
        self._buffers[slot[0]][slot[1]] = None
        return slot

    def _move(self, src: Slot, dst: Slot) -> None:
        entry = self._buffers[src[0]][src[1]]
        assert entry is not None and self._buffers[dst[0]][dst[1]] is None
        self._buffers[src[0]][src[1]] = None
        self._put(entry, dst)

    def _earliest(self, lo: int, hi: int, want: EntryState, fits: int | None) -> Slot | None:
        """The first entry in state ``want`` in buffers lo..hi (that may sit in buffer ``fits``)."""
        for b in self._versions(lo, hi):
            for i, e in enumerate(self._slots(b)):
                if e is not None and e.state == want and (fits is None or e.version + self.eta >= fits):
                    return b, i
        return None

    def _refill_with_reserved(self, hole: Slot) -> Slot:
        """StaleFlow's movement: pull reserved entries from earlier buffers into the hole, repeatedly."""
        while True:
            src = self._earliest(self.head, hole[0] - 1, "reserved", fits=hole[0])
            if src is None:
                return hole
            self._move(src, hole)
            hole = src

    def _settle(self, hole: Slot) -> None:
        """After an abort: occupied entries move forward, reserved ones back, until nothing moves."""
        while True:
            if self.state(hole[0]) == "ready":
                return  # a Ready buffer needs nothing more
            src = self._earliest(hole[0] + 1, self.head + self.eta, "occupied", fits=None)
            if src is not None:
                self._move(src, hole)
                self._advance(hole)
            else:
                src = self._earliest(self.head, hole[0] - 1, "reserved", fits=hole[0])
                if src is None:
                    return
                self._move(src, hole)
            hole = src

    def _advance(self, slot: Slot) -> None:
        """An occupied entry just moved forward into ``slot``: place it as Occupy would (reserved
        entries from earlier buffers that may sit in ``slot`` take it, repeatedly; the entry then
        takes the earliest empty slot), so finished entries never wait behind reservations."""
        entry = self._buffers[slot[0]][slot[1]]
        assert entry is not None and entry.state == "occupied"
        self._remove(entry.key)
        self._refill_with_reserved(slot)
        dst = self._first_empty(self.head, slot[0], prefer_unready=True)
        assert dst is not None, "the refilled hole is an empty slot no later than the entry's own"
        self._put(entry, dst)
