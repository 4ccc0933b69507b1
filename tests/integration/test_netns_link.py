"""The namespace harness for real (bench/netns.py): two namespaces, a tbf-shaped veth between them,
control veths to the root namespace. Skipped, with the harness's reason, where namespaces cannot
be made (no root, no iproute2, no tbf)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bench.netns import list_namespaces, remove_stale, shaped_link, unavailable_reason

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(bool(unavailable_reason()), reason=str(unavailable_reason()))

# A receiver: accept one connection on HOST:PORT, read N bytes, answer one byte. Prints its port first.
SINK = """
import socket, sys
host, n = sys.argv[1], int(sys.argv[2])
srv = socket.socket(); srv.bind((host, 0)); srv.listen(1)
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept(); got = 0
while got < n:
    data = conn.recv(1 << 20)
    if not data: break
    got += len(data)
conn.sendall(b"k" if got == n else b"x")
"""
# A sender: connect to HOST:PORT, send N bytes, wait for the answer; prints the seconds it took.
SOURCE = """
import socket, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
payload = bytes(n)
t0 = time.perf_counter()
with socket.create_connection((host, port), timeout=60) as s:
    s.sendall(payload)
    assert s.recv(1) == b"k"
print(time.perf_counter() - t0)
"""


def _reachable(link, role: str, host: str, port: int) -> bool:
    probe = f"import socket; socket.create_connection(({host!r}, {port}), timeout=2).close()"
    return link.run(role, [sys.executable, "-c", probe], capture_output=True).returncode == 0


def test_a_tcp_transfer_across_the_link_runs_at_the_shaped_rate():
    """20 MB from the train namespace to the gen namespace over a 200 Mbit/s tbf: 0.8 s at the
    limit; the sender's time (connect to the receiver's last-byte answer) is 0.8-1.05 of it."""
    nbytes, rate = 20_000_000, 200_000_000
    with shaped_link("200mbit") as link:
        sink = link.popen("gen", [sys.executable, "-c", SINK, link.address("gen"), str(nbytes)],
                          stdout=subprocess.PIPE, text=True)
        try:
            port = int(sink.stdout.readline())
            sent = link.run("train", [sys.executable, "-c", SOURCE, link.address("gen"), str(port), str(nbytes)],
                            capture_output=True, text=True, timeout=120)
            assert sent.returncode == 0, sent.stderr
            assert sink.wait(timeout=30) == 0
            assert link.tx_bytes("train") >= nbytes  # the bytes went through the train end's tbf
        finally:
            sink.kill()
            sink.wait()
    seconds = float(sent.stdout)
    efficiency = nbytes * 8 / rate / seconds
    print(f"{nbytes} bytes in {seconds:.3f} s at {rate} bit/s: {efficiency:.3f} of the limit")
    assert 0.8 <= efficiency <= 1.05, (f"{seconds:.3f} s for {nbytes} bytes at {rate} bit/s: "
                                       f"{efficiency:.3f} of the limit")


def test_sites_reach_each_other_only_across_the_link_and_both_reach_the_root():
    with socket.socket() as server, shaped_link("1gbit") as link:
        server.bind((link.server_host, 0))  # a server in the root namespace, as the Prefect server is
        server.listen(8)
        threading.Thread(target=lambda: [server.accept() for _ in range(2)], daemon=True).start()
        port = server.getsockname()[1]
        assert _reachable(link, "train", link.server_host, port)
        assert _reachable(link, "gen", link.server_host, port)
        # listening on every address of the gen namespace: only the link's is reachable from train
        sink = link.popen("gen", [sys.executable, "-c", SINK, "0.0.0.0", "0"], stdout=subprocess.PIPE, text=True)
        try:
            sink_port = int(sink.stdout.readline())
            assert link.identify(sink.pid) == link.names["gen"]
            assert not _reachable(link, "train", link.plan.control["gen"], sink_port)  # not around the link
            assert _reachable(link, "train", link.address("gen"), sink_port)
        finally:
            sink.kill()
            sink.wait()
        names = set(link.names.values())
        assert names <= set(list_namespaces())
    assert not names & set(list_namespaces())  # torn down


def test_a_failure_inside_the_block_still_tears_everything_down():
    with pytest.raises(RuntimeError, match="boom"), shaped_link("100mbit") as link:
        names = set(link.names.values())
        raise RuntimeError("boom")
    assert not names & set(list_namespaces())
    assert remove_stale() == []


def test_what_a_killed_run_left_is_removed_by_the_next_use():
    """A run killed with SIGKILL cannot tear down: its namespaces and control veths stay until the
    next ``shaped_link`` finds their owner dead."""
    hold = ("import sys, time; sys.path.insert(0, '.'); from bench.netns import shaped_link\n"
            "with shaped_link('100mbit') as link:\n"
            "    print(' '.join(link.names.values()), flush=True); time.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    left = set(child.stdout.readline().split())
    child.kill()
    child.wait()
    assert len(left) == 2 and left <= set(list_namespaces())
    with shaped_link("100mbit"):
        assert not left & set(list_namespaces())


def test_each_namespace_is_a_host_of_its_own_for_the_weights_shared_memory_path():
    """Relays in two namespaces never take the shared-memory shortcut between them (their host ids
    differ): the two sites' weights cross the link, as between two machines."""
    from services.weights.blob import host_id

    probe = "from services.weights.blob import host_id; print(host_id())"
    with shaped_link("1gbit") as link:
        ids = {role: link.run(role, [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
               for role in ("train", "gen")}
    assert all(r.returncode == 0 for r in ids.values()), {k: r.stderr[-500:] for k, r in ids.items()}
    train, gen = (ids[r].stdout.strip() for r in ("train", "gen"))
    assert len({train, gen, host_id()}) == 3, (train, gen, host_id())
    assert train.rsplit(":", 1)[0] == gen.rsplit(":", 1)[0] == host_id().rsplit(":", 1)[0]  # the same machine
