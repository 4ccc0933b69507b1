"""Two sites on one machine joined by a real, kernel-shaped link: network namespaces, veth, tbf.

``shaped_link(rate)`` makes two network namespaces (by default ``train`` and ``gen``), each with
loopback up, and joins them with one veth pair, the *link*: a /30 with one address on each end
and a ``tbf`` qdisc on both ends at ``rate`` (``tbf_params``: a burst of ``BURST_S`` of the rate,
never under ``MIN_BURST``, and a queue of ``LATENCY_MS``). Services of the two sites bind the
link's addresses, so everything between them crosses the shaped link, in both directions. This
kernel has no ``sch_netem``: the link has a rate, not a delay (``bench/weights_lib.DelayProxy``
adds one in user space when wanted).

Each namespace also gets an unshaped *control* veth to the root namespace (a /30 of its own), and
a host route to every root-side control address: a process in the root namespace (a Prefect
server on ``ShapedLink.server_host``, pytest) reaches both sites and both sites reach it, while
the sites reach each other only across the link (no forwarding, no default route: nothing can
leave the machine).

Names and addresses are unique per use, so parallel pytest workers never collide: namespaces
are ``braidnet-<pid>-<slot>-<role>``, the root ends of the control veths ``bn<slot>t/g``, and each
use takes a free /28 *slot* of ``BASE`` (link /30, then one control /30 per role), picked under a
file lock against the root namespace's addresses and routes. Everything is removed when the
block exits, also on an exception or Ctrl-C; what a killed run left behind (its owner pid is
dead) is removed by ``remove_stale`` at the next use. ``unavailable_reason`` says why none of
this can be made here (not root, no ``ip``/``tc``, ``ip netns add`` refused, no ``tbf``), for
tests to skip with.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import ipaddress
import os
import random
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from flows.processes import pid_alive

PREFIX = "braidnet"  # every namespace this module makes starts with it
BASE = ipaddress.ip_network("10.213.0.0/16")  # private space nothing on these machines uses; /28 slots
SLOT_BITS = 28  # one slot: the link /30 and one control /30 per role (two roles: 12 of 16 addresses)
LOCK = Path("/tmp/braidnet.lock")  # slot picking and set-up, serialized across processes
LINK_DEV = "braid-link"  # the shaped veth, inside each namespace
CTL_DEV = "braid-ctl"  # the control veth, inside each namespace
BURST_S = 0.005  # tbf bucket: 5 ms of the rate (a sender descheduled a few ms still gets the rate)
MIN_BURST = 64 * 1024  # at least one full GSO packet, so tbf need not split them
LATENCY_MS = 50  # queue before tbf drops: 50 ms of the rate, room for TCP's window
ROLES = ("train", "gen")
UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}


class NetnsError(RuntimeError):
    """A namespace, veth, address, route or qdisc could not be made (the message has ip's words)."""


# ---------------------------------------------------------------- pure: addresses, tbf, commands
@dataclass(frozen=True)
class Plan:
    """Every address of one use, from its slot."""

    slot: int
    link: dict[str, str]  # role -> its address on the shaped /30
    root: dict[str, str]  # role -> the root namespace's end of that role's control veth
    control: dict[str, str]  # role -> the namespace's end of its control veth

    @property
    def network(self) -> ipaddress.IPv4Network:
        return slot_network(self.slot)


def slot_network(slot: int) -> ipaddress.IPv4Network:
    count = 2 ** (SLOT_BITS - BASE.prefixlen)
    if not 0 <= slot < count:
        raise ValueError(f"slot {slot} outside {BASE} (0..{count - 1})")
    return ipaddress.ip_network(f"{BASE.network_address + slot * 2 ** (32 - SLOT_BITS)}/{SLOT_BITS}")


def plan_addresses(slot: int, roles: Sequence[str] = ROLES) -> Plan:
    """The link /30 first (``.1`` the first role, ``.2`` the second), then a control /30 per role
    (root end ``.1``, namespace end ``.2`` of that /30)."""
    if len(roles) != 2 or roles[0] == roles[1]:
        raise ValueError(f"a link joins two different roles, not {list(roles)}")
    base = slot_network(slot).network_address
    link = {roles[0]: str(base + 1), roles[1]: str(base + 2)}
    root = {r: str(base + 4 * (i + 1) + 1) for i, r in enumerate(roles)}
    control = {r: str(base + 4 * (i + 1) + 2) for i, r in enumerate(roles)}
    return Plan(slot, link, root, control)


def busy_slots(used: Iterable[ipaddress.IPv4Network]) -> set[int]:
    """Slots any of ``used`` overlaps (the default route left out)."""
    count, base = 2 ** (SLOT_BITS - BASE.prefixlen), int(BASE.network_address)
    busy: set[int] = set()
    for n in used:
        if n.prefixlen == 0 or not n.overlaps(BASE):
            continue
        if BASE.subnet_of(n):
            return set(range(count))
        first, last = ((int(n.network_address) - base) >> (32 - SLOT_BITS),
                       (int(n.broadcast_address) - base) >> (32 - SLOT_BITS))
        busy.update(range(first, last + 1))
    return busy


def pick_slot(used: Iterable[ipaddress.IPv4Network], rng: random.Random) -> int:
    """A random slot whose /28 overlaps none of ``used`` (the root namespace's addresses and
    routes); ``NetnsError`` when every slot is taken."""
    busy = busy_slots(used)
    free = [s for s in range(2 ** (SLOT_BITS - BASE.prefixlen)) if s not in busy]
    if not free:
        raise NetnsError(f"no free /{SLOT_BITS} left in {BASE}: the root namespace's addresses and routes cover it")
    return rng.choice(free)


def parse_rate(rate: str | int) -> int:
    """Bits per second from an int or tc's notation (``200mbit``, ``1gbit``, ``500kbit``, ``64bit``)."""
    if isinstance(rate, int):
        bps = rate
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit)?\s*", rate.lower())
        if not m:
            raise ValueError(f"rate {rate!r}: expected bits per second, e.g. 200mbit, 1gbit, 500kbit")
        bps = int(float(m.group(1)) * UNITS[m.group(2) or "bit"])
    if bps < 8000:
        raise ValueError(f"rate {rate!r} is under 8 kbit/s: tbf cannot shape it sensibly")
    return bps


@dataclass(frozen=True)
class Tbf:
    rate_bps: int
    burst_bytes: int
    latency_ms: int


def tbf_params(rate: str | int) -> Tbf:
    bps = parse_rate(rate)
    return Tbf(bps, max(MIN_BURST, int(bps / 8 * BURST_S)), LATENCY_MS)


def tbf_command(ns: str, dev: str, tbf: Tbf) -> list[str]:
    return ["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{tbf.rate_bps}bit",
            "burst", str(tbf.burst_bytes), "latency", f"{tbf.latency_ms}ms"]


def netns_exec(ns: str, argv: Sequence[str]) -> list[str]:
    """``argv`` run inside namespace ``ns``."""
    return ["ip", "netns", "exec", ns, *argv]


def namespace_name(pid: int, slot: int | str, role: str) -> str:
    return f"{PREFIX}-{pid}-{slot}-{role}"


def root_dev(slot: int, role: str) -> str:
    """The root namespace's end of a role's control veth (15 characters at most)."""
    return f"bn{slot}{role[0]}"


def owner_pid(name: str) -> int | None:
    m = re.fullmatch(rf"{PREFIX}-(\d+)-[^-]+-.+", name)
    return int(m.group(1)) if m else None


def stale(names: Iterable[str], alive: Callable[[int], bool]) -> list[str]:
    """Namespaces of this module whose owner process is gone."""
    return [n for n in names if (pid := owner_pid(n)) is not None and not alive(pid)]


def setup_commands(plan: Plan, names: dict[str, str], tbf: Tbf) -> list[list[str]]:
    """Every command that builds one use, in order (namespaces exist already)."""
    a, b = list(plan.link)
    cmds = [["ip", "link", "add", LINK_DEV, "netns", names[a], "type", "veth", "peer", "name", LINK_DEV,
             "netns", names[b]]]
    for role, ns in names.items():
        dev = root_dev(plan.slot, role)
        cmds += [
            ["ip", "-n", ns, "link", "set", "lo", "up"],
            ["ip", "-n", ns, "addr", "add", f"{plan.link[role]}/30", "dev", LINK_DEV],
            ["ip", "-n", ns, "link", "set", LINK_DEV, "up"],
            tbf_command(ns, LINK_DEV, tbf),
            ["ip", "link", "add", dev, "type", "veth", "peer", "name", CTL_DEV, "netns", ns],
            ["ip", "addr", "add", f"{plan.root[role]}/30", "dev", dev],
            ["ip", "link", "set", dev, "up"],
            ["ip", "-n", ns, "addr", "add", f"{plan.control[role]}/30", "dev", CTL_DEV],
            ["ip", "-n", ns, "link", "set", CTL_DEV, "up"],
        ]
    for role, ns in names.items():  # every root-side address, through this namespace's own control veth
        cmds += [["ip", "-n", ns, "route", "add", f"{plan.root[other]}/32", "via", plan.root[role], "dev", CTL_DEV]
                 for other in names if other != role]
    return cmds


# ---------------------------------------------------------------- mechanism
def _sh(cmd: Sequence[str], check: bool = True) -> str:
    proc = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise NetnsError(
            f"`{' '.join(cmd)}` failed (exit {proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}"
        )
    return proc.stdout


def list_namespaces() -> list[str]:
    return [line.split()[0] for line in _sh(["ip", "netns", "list"]).splitlines() if line.strip()]


def remove_stale() -> list[str]:
    """Remove the namespaces (and root-side control veths) of this module's dead owners."""
    gone = stale(list_namespaces(), pid_alive)
    for name in gone:
        slot, role = name.split("-")[2:4]
        if slot.isdigit():
            _sh(["ip", "link", "del", root_dev(int(slot), role)], check=False)
        _sh(["ip", "netns", "del", name], check=False)
    return gone


def _used_networks() -> list[ipaddress.IPv4Network]:
    out = []
    for line in _sh(["ip", "-o", "-4", "addr", "show"]).splitlines():
        m = re.search(r"inet (\S+)", line)
        if m:
            out.append(ipaddress.ip_interface(m.group(1)).network)
    for line in _sh(["ip", "-4", "route", "show"]).splitlines():
        dest = line.split()[0] if line.strip() else "default"
        if dest != "default":
            out.append(ipaddress.ip_network(dest, strict=False))
    return out


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> str | None:
    """Why two shaped namespaces cannot be made here, or None when they can (probed once)."""
    if os.geteuid() != 0:
        return f"network namespaces need root (running as uid {os.geteuid()})"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"no `{tool}` command (iproute2) on this machine"
    ns = namespace_name(os.getpid(), "probe", "probe")
    try:
        _sh(["ip", "netns", "add", ns])
    except NetnsError as err:
        return f"`ip netns add` is refused here: {err}"
    try:
        # as setup does
        _sh(["ip", "link", "add", "p0", "netns", ns, "type", "veth", "peer", "name", "p1", "netns", ns])
        _sh(tbf_command(ns, "p0", tbf_params("100mbit")))
    except NetnsError as err:
        return f"no veth or no tbf qdisc in this kernel: {err}"
    finally:
        _sh(["ip", "netns", "del", ns], check=False)
    return None


@dataclass
class ShapedLink:
    """One use: its plan, the namespace of each role, the link's rate."""

    plan: Plan
    names: dict[str, str]
    tbf: Tbf

    def address(self, role: str) -> str:
        """The role's address on the shaped link (what the other site dials)."""
        return self.plan.link[role]

    @property
    def server_host(self) -> str:
        """A root-namespace address every namespace reaches unshaped (for a Prefect server)."""
        return self.plan.root[next(iter(self.names))]

    def command(self, role: str, argv: Sequence[str]) -> list[str]:
        return netns_exec(self.names[role], argv)

    def run(self, role: str, argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(role, argv), **kwargs)

    def popen(self, role: str, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(role, argv), **kwargs)

    def tx_bytes(self, role: str) -> int:
        """Bytes the role's end of the link has sent (its qdisc's count, what tbf shaped)."""
        out = _sh(["tc", "-s", "-n", self.names[role], "qdisc", "show", "dev", LINK_DEV])
        m = re.search(r"Sent (\d+) bytes", out)
        if not m:
            raise NetnsError(f"no tbf statistics on {LINK_DEV} in {self.names[role]}: {out!r}")
        return int(m.group(1))

    def identify(self, pid: int) -> str:
        """The name of the namespace process ``pid`` is in ("" for the root namespace)."""
        return _sh(["ip", "netns", "identify", str(pid)], check=False).strip()


def _teardown(slot: int, names: Iterable[str], roles: Iterable[str]) -> None:
    for role in roles:
        _sh(["ip", "link", "del", root_dev(slot, role)], check=False)  # both ends go, even with processes inside
    for ns in names:
        _sh(["ip", "netns", "del", ns], check=False)


@contextlib.contextmanager
def shaped_link(
    rate: str | int, roles: Sequence[str] = ROLES, rng: random.Random | None = None
) -> Iterator[ShapedLink]:
    """Two namespaces joined by a veth shaped to ``rate`` on both ends (module docstring); all of
    it removed when the block exits. Stop the processes started inside first."""
    why = unavailable_reason()
    if why:
        raise NetnsError(why)
    tbf = tbf_params(rate)
    names: dict[str, str] = {}
    slot = -1
    try:
        with LOCK.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            remove_stale()
            slot = pick_slot(_used_networks(), rng or random.Random())
            plan = plan_addresses(slot, roles)
            for role in roles:
                names[role] = namespace_name(os.getpid(), slot, role)
                _sh(["ip", "netns", "add", names[role]])
            for cmd in setup_commands(plan, names, tbf):
                _sh(cmd)
        yield ShapedLink(plan, dict(names), tbf)
    finally:
        if slot >= 0:
            _teardown(slot, names.values(), roles)
