"""The SGS instances a rollout dials, as they come and go (mechanism).

``FleetKeeper`` keeps the ``InstanceRouter``'s slots in step with the processes behind them:

- a lost instance (its call or weight push failed UNAVAILABLE) is marked so; the launcher starts it
  again on its port, and once it answers it gets a fresh weight pusher and the newest version and
  is routable again (``readmit.py``: ``instances_readmitted``); with none alive the run waits
  ``ALL_LOST_WAIT_S`` for one;
- with scale-out and no router, instances join and leave through ``sgs-membership.json``
  (``membership.py``): a joining one gets a slot and the same bring-up as a readmitted one
  (``instances_joined``); a leaving one takes no new work and is acknowledged drained once it
  holds nothing (``instances_left``).

The orchestrator resumes a lost instance's trajectories itself; this class owns the slots.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

from services.rollout.membership import MembershipFile
from services.rollout.readmit import Readmission
from services.rollout.routing import InstanceRouter

log = logging.getLogger("braid.rollout")


class FleetKeeper:
    ALL_LOST_WAIT_S = 120.0  # how long every instance may be gone (restarting) before the run fails

    def __init__(self, rt, router: InstanceRouter, counts: Counter, on_join=None) -> None:
        self.rt, self.router, self.counts = rt, router, counts
        self.readmission = Readmission(rt.publisher)
        self.membership = MembershipFile(rt.run_dir)
        self.on_join = on_join  # called with the new slot's index (the caller's per-instance lists grow)
        self.joining: set[int] = set()
        self.leaving: dict[int, tuple[str, int]] = {}  # slot -> (address, samples it held), until drained
        self.all_lost_at: float | None = None

    def lost(self, i: int) -> None:
        self.router.lose(i)
        self.counts["instances_lost"] += 1
        if not self.router.live():
            self.all_lost_at = time.monotonic()

    def poll(self, latest: tuple[int, object]) -> None:
        """Follow the membership file; readmit what came back; release what drained."""
        self._follow()
        down = [i for i, ok in enumerate(self.router.alive) if not ok]
        for i in self.readmission.poll(down, latest) if down else []:
            self.router.readmit(i)
            self.all_lost_at = None
            address = self.rt.clients[i].address
            if i in self.joining:
                self.joining.discard(i)
                self.counts["instances_joined"] += 1
                self.membership.ack(address, "joined", version=latest[0])
            else:
                self.counts["instances_readmitted"] += 1
                log.warning("SGS instance %d (%s) is back at version %d", i, address, latest[0])
        for i, (address, held) in list(self.leaving.items()):
            if self.router.inflight[i] == 0:
                del self.leaving[i]
                self.counts["instances_left"] += 1
                self.membership.ack(address, "drained", held=held)
        if self.all_lost_at is not None and time.monotonic() - self.all_lost_at > self.ALL_LOST_WAIT_S:
            raise RuntimeError(f"every SGS instance is gone and none came back within {self.ALL_LOST_WAIT_S:.0f} s")

    def _follow(self) -> None:
        wanted = self.membership.changed()
        if wanted is None:
            return
        slots = {c.address: i for i, c in enumerate(self.rt.clients)}
        for address, state in wanted.items():
            i = slots.get(address)
            if i is None and state == "active":
                self._join(address)
            elif i is not None and state == "leaving" and self.router.open[i]:
                self.router.close(i)
                self.leaving[i] = (address, self.router.inflight[i])
                log.info("SGS instance %d (%s) leaves: no new work, %d samples to finish", i, address,
                         self.router.inflight[i])

    def _join(self, address: str) -> None:
        client = self.rt.connect(address)
        self.rt.clients.append(client)
        self.rt.publisher.add(client)
        i = self.router.add()  # not routable until it has the newest weights
        self.joining.add(i)
        if self.on_join is not None:
            self.on_join(i)
        log.info("SGS instance %d (%s) joins", i, address)
