"""``services.rollout.repack.Repacker``: what a migration counts in its destination's load."""

from __future__ import annotations

from collections import Counter

from services.rollout.repack import Repacker
from services.rollout.repack_policy import Migrate, RepackCoordinator


class _Client:
    def __init__(self, interrupts: int) -> None:
        self.interrupts = interrupts
        self.tags: list[str] = []

    def interrupt(self, tags: list[str]) -> int:
        self.tags = list(tags)
        return self.interrupts


def _started(keys: list[str], interrupts: int) -> tuple[Repacker, list[Counter]]:
    seen: list[Counter] = []
    rp = Repacker(True, RepackCoordinator(), on_change=lambda c: seen.append(Counter(c)))
    rp.start(Migrate(source=3, destination=8, version=0, samples=interrupts, kv_used=0.01), keys, ["group-a"],
             _Client(interrupts))
    return rp, seen


def test_only_trajectories_that_came_back_interrupted_count_in_the_destination_load():
    # the pool still places 5 trajectories on the source; the engine ran 2 of them, the rest finished
    rp, seen = _started([f"a/{i}" for i in range(5)], interrupts=2)
    assert rp.incoming() == Counter()  # nothing came back yet: the destination's load is unchanged
    assert rp.in_transit() == Counter({3: 5, 8: 5})  # both stay out of the next plan meanwhile
    rp.interrupted("a/0")
    rp.interrupted("a/0")  # once only
    rp.interrupted("a/1")
    assert rp.incoming() == Counter({8: 2}) and seen[-1] == Counter({8: 2})
    for k in ("a/2", "a/3", "a/4"):  # finished on the source before the Interrupt reached them
        rp.forget(k)
    rp.launched("a/0", 8)
    rp.launched("a/1", 5)
    assert rp.incoming() == Counter() and rp.in_transit() == Counter() and rp.moving == {}
    assert rp.counts == Counter({"repacks": 1, "migration_candidates": 5, "migrations_sent": 2, "migrated": 1,
                                 "migrated_elsewhere": 1})


def test_a_key_never_started_is_ignored_when_it_comes_back_interrupted():
    rp, seen = _started(["a/0"], interrupts=1)
    n = len(seen)
    rp.interrupted("b/0")  # interrupted by something else (partial rollout's sync): not a migration
    assert rp.incoming() == Counter() and len(seen) == n
