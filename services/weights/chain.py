"""Broadcast plan for the weight relays (pure policy: plain dataclasses in, a plan out, no I/O).

Laminar §4.2 / Appendix C: the master relay receives each version from the trainer and
forwards its chunks down a *chain* of relays as they arrive, so every hop works at once and
the broadcast time is ~ M*T_byte + (p + k - 2) chunk times: nearly flat in the number of
relays p. StreamRL §6 adds the cross-site rule: a thin site-to-site link should carry each
version exactly once, then fan out locally. The plan therefore is a tree of chains:

- the master (on the training site) heads a chain through the other relays of its own site;
- for every other site, the master (not a relay of another remote site: sites may only be
  linked to the training site) sends one copy to that site's *head* relay, which heads a chain
  through the rest of its site.

So each site-to-site link carries exactly one copy per version, and within a site the chain
pipelines. Every relay gets its *branches*: for each child, the whole remaining chain below
it, nearest first. When a child dies the parent re-links in O(1) by skipping to the next
relay of that branch (Laminar §4.3) while the controller recomputes the plan for everyone.

``choose_master`` keeps the current master while it lives, else promotes the first live relay
of the training site (else of any site); the controller tells the trainer where to push.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RelayNode:
    relay_id: str  # its address for peers on the same site
    site: str
    alive: bool = True
    remote_id: str = ""  # its address for peers on other sites (TLS port); empty = relay_id

    def address_for(self, peer_site: str) -> str:
        return self.remote_id if peer_site != self.site and self.remote_id else self.relay_id


@dataclass(frozen=True)
class BroadcastPlan:
    master: str
    branches: dict[str, list[list[str]]] = field(default_factory=dict)  # relay -> chains below it
    upstream: dict[str, str] = field(default_factory=dict)  # relay -> its parent

    def order(self) -> list[str]:
        """Every relay in the plan, parents before children."""
        out, todo = [], [self.master]
        while todo:
            r = todo.pop(0)
            out.append(r)
            todo.extend(branch[0] for branch in self.branches.get(r, []) if branch)
        return out

    def edges(self) -> list[tuple[str, str]]:
        return [(parent, child) for child, parent in sorted(self.upstream.items())]


def choose_master(nodes: list[RelayNode], training_site: str, current: str | None) -> str | None:
    live = [n for n in nodes if n.alive]
    if any(n.relay_id == current for n in live):
        return current
    home = [n for n in live if n.site == training_site]
    pick = (home or live)[:1]
    return pick[0].relay_id if pick else None


def plan_broadcast(nodes: list[RelayNode], master: str) -> BroadcastPlan:
    """The tree of chains over the live relays (site-contiguous chains, one copy per site link)."""
    live = [n for n in nodes if n.alive]
    by_id = {n.relay_id: n for n in live}
    if master not in by_id:
        raise ValueError(f"master {master!r} is not a live relay ({sorted(by_id)})")
    home = by_id[master].site
    sites: dict[str, list[str]] = {}
    for n in live:
        sites.setdefault(n.site, []).append(n.relay_id)
    local = [master] + [r for r in sites.get(home, []) if r != master]
    branches: dict[str, list[list[str]]] = {r: [] for r in by_id}
    upstream: dict[str, str] = {}

    def chain(parent: str, members: list[str]) -> None:
        if members:
            branches[parent].append(list(members))
            prev = parent
            for r in members:
                upstream[r] = prev
                if r != members[-1]:
                    branches[r].append(members[members.index(r) + 1 :])
                prev = r

    chain(master, local[1:])
    for site in sorted(s for s in sites if s != home):
        chain(master, sites[site])
    return BroadcastPlan(master, branches, upstream)


def cross_site_copies(plan: BroadcastPlan, site_of: dict[str, str]) -> dict[tuple[str, str], int]:
    """Copies per version on each (from_site, to_site) link."""
    counts: dict[tuple[str, str], int] = {}
    for parent, child in plan.edges():
        a, b = site_of[parent], site_of[child]
        if a != b:
            counts[(a, b)] = counts.get((a, b), 0) + 1
    return counts


def relink(branch: list[str], dead: set[str]) -> list[str]:
    """The branch with dead relays cut out: the parent's next hop is the first live one (O(1)
    per dead relay it skips)."""
    return [r for r in branch if r not in dead]
