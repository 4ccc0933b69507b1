"""Helpers of ``bench/weights.py``: child processes, network namespaces, a delay line.

- ``Child``: a Python child process that imports first, then waits for ``go`` on stdin, so its
  start-up never counts in a timing (``python bench/weights_lib.py pull|raw-recv ...``).
- ``start_relay``: a relay process, optionally inside a network namespace.
- ``Netns``: namespaces joined by veth pairs (point to point, or through a bridge), with ``tbf``
  rate limits. This kernel has no ``sch_netem``, so link latency is added by ``DelayProxy``: a
  TCP forwarder in front of a service that holds every byte for ``delay_s`` in each direction.
Everything created is removed by ``Netns.cleanup`` (also at exit).
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def sh(*cmd: str, check: bool = True) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")
    return proc.stdout


def env() -> dict[str, str]:
    return dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")


def cpu_busy_s() -> float:
    """CPU-seconds the whole machine has spent busy (all cores, every process, the kernel's
    network stack included): from ``/proc/stat``; a difference brackets a transfer."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def netns_prefix(ns: str | None) -> list[str]:
    return ["ip", "netns", "exec", ns] if ns else []


class Child:
    """``python bench/weights_lib.py ARGS``; ``go()`` starts the timed part, ``result()`` its JSON."""

    def __init__(self, *args: str, ns: str | None = None) -> None:
        self.proc = subprocess.Popen(
            [*netns_prefix(ns), sys.executable, str(Path(__file__)), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=ROOT,
        )
        line = self.proc.stdout.readline()
        if not line.startswith("ready"):
            raise RuntimeError(f"child {args} failed: {line}{self.proc.stderr.read()[-2000:]}")
        self.info = line.split()[1:]

    def go(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def result(self, timeout_s: float = 600) -> dict:
        out, err = self.proc.communicate(timeout=timeout_s)
        if self.proc.returncode != 0:
            raise RuntimeError(f"child failed: {err[-3000:]}")
        return json.loads(out.strip().splitlines()[-1])


def start_relay(
    workdir: Path, name: str, *args: str, ns: str | None = None, host: str = "127.0.0.1"
) -> tuple[subprocess.Popen, str]:
    port_file = workdir / f"{name}.port"
    port_file.unlink(missing_ok=True)
    log = (workdir / f"{name}.log").open("w")
    proc = subprocess.Popen(
        [*netns_prefix(ns), sys.executable, "-m", "services.weights", "--host", host, "--port", "0",
         "--port-file", str(port_file), "--id", name, *args],
        stdout=log, stderr=subprocess.STDOUT, env=env(), cwd=ROOT,
    )
    deadline = time.monotonic() + 60
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"relay {name} did not start: {(workdir / f'{name}.log').read_text()[-2000:]}")
        time.sleep(0.05)
    return proc, port_file.read_text().split()


def stop(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class Netns:
    """Network namespaces for one benchmark part; ``cleanup`` removes them (idempotent)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.names: list[str] = []
        self.links: list[str] = []
        atexit.register(self.cleanup)

    def add(self, name: str) -> str:
        ns = f"{self.prefix}-{name}"
        sh("ip", "netns", "del", ns, check=False)
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        self.names.append(ns)
        return ns

    def veth(
        self, a: str, a_ip: str, b: str | None, b_ip: str | None, name: str, bridge: str | None = None
    ) -> tuple[str, str]:
        """A veth pair from namespace ``a`` to namespace ``b`` (or to ``bridge`` in the root)."""
        left, right = f"{name}a", f"{name}b"
        sh("ip", "link", "del", left, check=False)
        sh("ip", "link", "add", left, "type", "veth", "peer", "name", right)
        self.links.append(left)
        sh("ip", "link", "set", left, "netns", a)
        sh("ip", "-n", a, "addr", "add", a_ip, "dev", left)
        sh("ip", "-n", a, "link", "set", left, "up")
        if bridge:
            sh("ip", "link", "set", right, "master", bridge)
            sh("ip", "link", "set", right, "up")
        else:
            sh("ip", "link", "set", right, "netns", b)
            sh("ip", "-n", b, "addr", "add", b_ip, "dev", right)
            sh("ip", "-n", b, "link", "set", right, "up")
        return left, right

    def bridge(self, name: str, ip: str) -> str:
        sh("ip", "link", "del", name, check=False)
        sh("ip", "link", "add", name, "type", "bridge")
        sh("ip", "addr", "add", ip, "dev", name)
        sh("ip", "link", "set", name, "up")
        self.links.append(name)
        return name

    @staticmethod
    def limit(dev: str, rate: str, ns: str | None = None) -> None:
        """Token-bucket rate limit on ``dev``'s egress."""
        base = ["tc"] + (["-n", ns] if ns else [])
        sh(*base, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", "512kb", "latency", "100ms")

    @staticmethod
    def tx_bytes(dev: str, ns: str | None) -> int:
        return int(sh(*netns_prefix(ns), "cat", f"/sys/class/net/{dev}/statistics/tx_bytes").strip())

    def cleanup(self) -> None:
        for link in self.links:
            sh("ip", "link", "del", link, check=False)
        for ns in self.names:
            sh("ip", "netns", "del", ns, check=False)
        self.links, self.names = [], []


# ---------------------------------------------------------------- delay line (no sch_netem here)
async def _pipe(reader, writer, delay_s: float) -> None:
    queue: asyncio.Queue = asyncio.Queue()

    async def pump() -> None:
        while True:
            due, data = await queue.get()
            if data is None:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        writer.close()

    task = asyncio.create_task(pump())
    try:
        while data := await reader.read(1 << 18):
            queue.put_nowait((time.monotonic() + delay_s, data))
    except ConnectionError:
        pass
    queue.put_nowait((0.0, None))
    await task


async def _proxy(listen: tuple[str, int], target: tuple[str, int], delay_s: float, ready) -> None:
    async def handle(reader, writer) -> None:
        try:
            t_reader, t_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, t_writer, delay_s), _pipe(t_reader, writer, delay_s), return_exceptions=True)

    server = await asyncio.start_server(handle, *listen)
    ready(server.sockets[0].getsockname()[1])
    async with server:
        await server.serve_forever()


def _child_main(argv: list[str]) -> int:
    kind = argv[0]
    if kind == "proxy":  # proxy LISTEN_HOST TARGET_HOST:PORT DELAY_S
        host, target, delay = argv[1], argv[2], float(argv[3])
        th, tp = target.rsplit(":", 1)
        asyncio.run(_proxy((host, 0), (th, int(tp)), delay, lambda port: print(f"ready {port}", flush=True)))
        return 0
    if kind == "raw-recv":  # raw-recv NBYTES: receive NBYTES on a fresh socket, ack with one byte
        n = int(argv[1])
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        buf = bytearray(n)
        print(f"ready {srv.getsockname()[1]}", flush=True)
        conn, _ = srv.accept()
        mv, got = memoryview(buf), 0
        t0 = time.perf_counter()
        while got < n:
            got += conn.recv_into(mv[got:], min(n - got, 1 << 22))
        conn.sendall(b"k")
        print(json.dumps({"seconds": time.perf_counter() - t0}))
        return 0
    if kind == "pull":  # pull ADDRESS VERSION STREAMS SHM(0/1) [DATA_PATH tcp|grpc]
        from services.weights.client import RelayClient

        client = RelayClient(argv[1], data_path=argv[5] if len(argv) > 5 else "tcp")
        client.wait_ready()
        if len(argv) > 6:  # the receive buffer is allocated before timing, as raw-recv's bytearray (memset) is
            client.reserve(int(argv[6]))
        import torch

        torch.zeros(1).sum()  # torch's first-op set-up (~10 ms), which a serving process has long paid, before timing
        print("ready", flush=True)
        sys.stdin.readline()
        c0, t0 = cpu_busy_s(), time.perf_counter()
        got = client.pull(int(argv[2]), streams=int(argv[3]), allow_shm=argv[4] == "1")
        sum(float(t.view(-1)[:1].sum()) for t in got.state.values() if t.numel())  # touch the tensors
        seconds, cpu = time.perf_counter() - t0, cpu_busy_s() - c0
        print(json.dumps({"seconds": seconds, "cpu_s": cpu, "path": got.path, "bytes": got.manifest.total_bytes}))
        return 0
    raise SystemExit(f"unknown child {kind}")


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
