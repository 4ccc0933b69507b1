"""The SGS instances a rollout dials, as they come and go (mechanism).

``FleetKeeper`` keeps the fleet table's rows (``fleet.Fleet``) in step with the processes behind them:

- a lost instance (its call failed UNAVAILABLE, or its weight push failed: the pusher's thread marks
  its row, ``publisher.py``; the multi-turn generator's loop marks the ones it finds) is noticed on
  the keeper's thread once per loss, whoever marked it (``notice``: counted, and handed to
  ``on_lost``, which resumes its work elsewhere); the launcher starts it again on its port, and
  once it answers it gets a fresh weight pusher and the newest version and is routable again
  (``readmit.py``: ``instances_readmitted``); with none alive the run waits ``ALL_LOST_WAIT_S``
  for one;
- with scale-out and no router, instances join and leave through ``sgs-membership.json``
  (``membership.py``): a joining one gets a row (``joining``) and the same bring-up as a readmitted
  one (``instances_joined``); a leaving one is ``draining`` (no new work) and is acknowledged
  drained once it holds nothing (``instances_left``).

The rows' states are the membership: a lost or joining row is what readmission probes, a draining
one what waits to be acknowledged. The connections (``rt.clients``) and weight pushers
(``rt.publisher``) are lists indexed by the row, and only ``_join`` grows them. The orchestrator
resumes a lost instance's trajectories itself (its ``on_lost``).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

from services.rollout.fleet import Fleet
from services.rollout.membership import MembershipFile
from services.rollout.readmit import Readmission

log = logging.getLogger("braid.rollout")


class FleetKeeper:
    ALL_LOST_WAIT_S = 120.0  # how long every instance may be gone (restarting) before the run fails

    def __init__(self, rt, fleet: Fleet, counts: Counter, on_lost: Callable[[int], None] | None = None) -> None:
        self.rt, self.fleet, self.counts = rt, fleet, counts
        self.readmission = Readmission(rt.publisher)
        self.membership = MembershipFile(rt.run_dir)
        self.on_lost = on_lost  # called on the keeper's thread with each row newly lost (its work resumes elsewhere)
        self.held: dict[int, int] = {}  # draining row -> samples it held when it began to leave
        self.noticed: dict[int, int] = {}  # row -> the epoch of the last loss noticed there
        self.all_lost_at: float | None = None

    def lost(self, i: int, why: str = "") -> bool:
        """Instance ``i`` is gone (seen on the keeper's thread); False when it was lost already (nothing
        counted). Every loss marked by now is noticed at once."""
        marked = self.fleet.mark_lost(i, why)
        self.notice()
        return marked

    def notice(self) -> list[int]:
        """The rows lost since the last look, whoever marked them (this thread, a weight pusher's, the
        multi-turn generator's loop): each loss counted once and handed to ``on_lost``."""
        rows = self.fleet.snapshot()
        new = [r for r in rows.rows if r.state == "lost" and self.noticed.get(r.index) != r.epoch]
        for r in new:
            self.noticed[r.index] = r.epoch
            self.counts["instances_lost"] += 1
            log.warning("SGS instance %d (%s) lost (%s)", r.index, r.address, r.why)
        if new and not rows.live():
            self.all_lost_at = time.monotonic()
        for r in new:
            if self.on_lost is not None:
                self.on_lost(r.index)
        return [r.index for r in new]

    def poll(self, latest: tuple[int, object]) -> None:
        """Notice losses; follow the membership file; readmit what came back; release what drained."""
        self.notice()
        self._follow()
        rows = self.fleet.snapshot()
        down = [i for i in rows.in_state("lost", "joining") if i not in self.held]  # a leaving one stays out
        for i in self.readmission.poll(down, latest) if down else []:
            if i not in down:  # it began to leave while its weights were on their way
                continue
            joined = rows[i].state == "joining"
            self.fleet.mark_live(i, self.rt.publisher.pushers[i].offered)  # the version staged there
            self.all_lost_at = None
            address = rows[i].address
            if joined:
                self.counts["instances_joined"] += 1
                self.membership.ack(address, "joined", version=latest[0])
            else:
                self.counts["instances_readmitted"] += 1
                log.warning("SGS instance %d (%s) is back at version %d", i, address, latest[0])
        for i in self.fleet.snapshot().in_state("draining", "lost"):
            if i in self.held and self.fleet.snapshot()[i].inflight == 0:
                self.fleet.remove(i)
                self.counts["instances_left"] += 1
                self.membership.ack(rows[i].address, "drained", held=self.held.pop(i))
        if self.all_lost_at is not None and time.monotonic() - self.all_lost_at > self.ALL_LOST_WAIT_S:
            raise RuntimeError(f"every SGS instance is gone and none came back within {self.ALL_LOST_WAIT_S:.0f} s")

    def _follow(self) -> None:
        wanted = self.membership.changed()
        if wanted is None:
            return
        rows = self.fleet.snapshot()
        for address, state in wanted.items():
            row = rows.by_address(address)
            if row is None and state == "active":
                self._join(address)
            elif row is not None and state == "leaving" and row.index not in self.held:
                self.held[row.index] = held = self.fleet.drain(row.index) if row.state != "lost" else 0
                log.info("SGS instance %d (%s) leaves: no new work, %d samples to finish", row.index, address, held)

    def _join(self, address: str) -> None:
        client = self.rt.connect(address)
        self.rt.clients.append(client)
        self.rt.publisher.add(client)
        i = self.fleet.join(address)  # joining: not routable until it has the newest weights
        assert i == len(self.rt.clients) - 1, f"row {i} of {address} is not its connection's index"
        log.info("SGS instance %d (%s) joins", i, address)
