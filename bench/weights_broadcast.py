"""(b) of ``bench/weights.py``: chained pipelined broadcast to p relays on rate-limited links.

Every relay runs in its own network namespace, attached to a bridge through a veth whose both
ends are limited by ``tbf`` to ``hop_rate``: each hop is network-bound, as between machines
(on two shared cores, unlimited loopback hops would measure CPU contention between p relay
processes instead). The trainer side (this process, root namespace) pushes one version to the
master over the network path; ``T(p)`` runs from the push's start until the last of the p relays
has committed it (relay-side ``committed_at``). Laminar Appendix C predicts
``T(p) ~ M/B + (p - 1) * chunk/B``: nearly flat in p for k >> p chunks.

Then the failure case (p = 4): relay 1 is killed while relay 2 is still receiving; the chain
controller cuts it out and re-plans, the master resumes relay 2 from its received prefix, and
every survivor must end with the version, byte-exact (equal version digests).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

RELAY_NET = "10.77.0"


def _start(work: Path, net, p: int, tag: str, hop_rate: str):
    """p relays, each in its own namespace behind a rate-limited veth (started in parallel)."""
    import subprocess
    import sys

    from bench.weights_lib import env, netns_prefix

    procs, addrs, pending = [], [], []
    for i in range(p):
        ns = net.add(f"{tag}{i}")
        net.hosts = getattr(net, "hosts", 9) + 1  # every relay of the run gets its own address on the bridge
        ip = f"{RELAY_NET}.{net.hosts}"
        left, right = net.veth(ns, f"{ip}/24", None, None, f"bw{tag}{i}", bridge=net.bridge_name)
        net.limit(left, hop_rate, ns)
        net.limit(right, hop_rate)
        port_file = work / f"b{tag}{i}.port"
        port_file.unlink(missing_ok=True)
        procs.append(subprocess.Popen(
            [*netns_prefix(ns), sys.executable, "-m", "services.weights", "--host", ip, "--port", "0",
             "--port-file", str(port_file), "--id", f"b{tag}{i}", "--keep", "1", "--no-shm"],
            stdout=(work / f"b{tag}{i}.log").open("w"), stderr=subprocess.STDOUT, env=env(),
        ))
        pending.append((ip, port_file))
    deadline = time.monotonic() + 120
    for (ip, port_file), proc in zip(pending, procs, strict=True):
        while not port_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"relay {port_file.stem} did not start")
            time.sleep(0.05)
        addrs.append(f"{ip}:{port_file.read_text().split()[0]}")
    return procs, addrs


def _broadcast_once(addrs: list[str], state, chunk: int, version: int = 1, kill=None) -> dict:
    from services.weights.chain import RelayNode
    from services.weights.client import RelayClient, snapshot_blob
    from services.weights.controller import ChainController

    clients = [RelayClient(a) for a in addrs]
    for c in clients:
        c.wait_ready()
    ctl = ChainController([RelayNode(a, "local") for a in addrs], "local", heartbeat_s=0.1, timeout_s=1.0).start()
    try:
        wb = snapshot_blob(state, chunk, None)
        t0 = time.time()
        pusher = threading.Thread(target=clients[0].push, args=(wb, version), kwargs={"streams": 1, "use_shm": False})
        pusher.start()  # the master forwards while it receives: the kill must land while the push still runs
        out: dict = {}
        if kill is not None:
            out = kill(clients, ctl)
        pusher.join()
        live = [c for i, c in enumerate(clients) if i not in out.get("killed", [])]
        deadline = time.monotonic() + 600
        while True:
            infos = [c.versions().versions.get(version) for c in live]
            if all(i is not None and i.complete for i in infos):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"broadcast to {len(addrs)} relays did not finish")
            time.sleep(0.05)
        out["seconds"] = max(i.committed_at for i in infos) - t0
        out["digests"] = {i.digest for i in infos}
        out["events"] = list(ctl.events)
        out["t0"] = t0
        return out
    finally:
        ctl.stop()
        for c in clients:
            c.close()


def bench_broadcast(work: Path, *, model_mb: int, hop_rate: str, chunk: int, ps=(1, 2, 4, 8)) -> dict:
    import torch

    from bench.weights_lib import Netns, stop

    state = {"w": torch.randn(model_mb * 1024 * 1024 // 4 - 1024), "b": torch.randn(1024)}
    net = Netns("bwb")
    net.bridge_name = net.bridge("bwbr0", f"{RELAY_NET}.1/24")
    times: dict[str, float] = {}
    try:
        for p in ps:
            procs, addrs = _start(work, net, p, f"p{p}x", hop_rate)
            try:
                res = _broadcast_once(addrs, state, chunk)
                assert len(res["digests"]) == 1
                times[str(p)] = res["seconds"]
                print(f"(b) p={p}: {res['seconds']:.2f}s", flush=True)
            finally:
                stop(procs)
        repair = _repair(work, net, state, chunk, hop_rate)
    finally:
        net.cleanup()
    return {"times": times, "model_mb": model_mb, "hop_rate": hop_rate, "chunk_bytes": chunk, "repair": repair}


def _repair(work: Path, net, state, chunk: int, hop_rate: str, p: int = 4) -> dict:
    from bench.weights_lib import stop

    procs, addrs = _start(work, net, p, "fx", hop_rate)

    def kill(clients, ctl) -> dict:
        while True:  # relay 2 holds about a third of the version: the broadcast is midway
            info = clients[2].versions().versions.get(1)
            if info is not None and info.received >= info.chunks // 3:
                break
            time.sleep(0.01)
        t_kill = time.time()
        procs[1].kill()
        while not any(e["change"] == "dead" for e in ctl.events):
            time.sleep(0.01)
        detect = next(e for e in ctl.events if e["change"] == "dead")["time"] - t_kill
        return {"killed": [1], "t_kill": t_kill, "detect_s": detect, "received_at_kill": info.received,
                "chunks": info.chunks}

    try:
        res = _broadcast_once(addrs, state, chunk, kill=kill)
    finally:
        stop(procs)
    relinks = [line for line in (work / "bfx0.log").read_text().splitlines() if "re-linked" in line]
    out = {
        "p": p, "detect_s": res["detect_s"], "survivors_ok": len(res["digests"]) == 1,
        "complete_after_kill_s": res["seconds"] + res["t0"] - res["t_kill"],
        "relinked_by": "the master's forwarder (skipped the dead hop)" if relinks
        else "the controller's re-plan (the master had already sent relay 1 everything)",
        "received_at_kill": f"{res['received_at_kill']}/{res['chunks']} chunks at relay 2",
    }
    print(f"(b) repair: dead relay cut out {out['detect_s']:.2f}s after the kill; survivors byte-exact "
          f"{out['survivors_ok']}", flush=True)
    return out
