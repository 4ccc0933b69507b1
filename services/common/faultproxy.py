"""A fault-injecting TCP proxy for loopback links (the chaos suite's network faults).

Put between a client and a service (``FaultProxy(target).start()`` listens on a free loopback
port; point the client at ``proxy.address``), it forwards bytes both ways and injects the
faults of its current ``Faults`` (changeable at any time with ``set``):

- ``delay_ms`` / ``jitter_ms``: each forwarded chunk waits ``delay + U(0, jitter)`` ms (a slow
  or distant link; order is kept per direction);
- ``reset_rate``: each forwarded chunk resets its connection with this probability (the peer
  sees ECONNRESET: gRPC's "Connection reset by peer");
- ``blackhole``: chunks are held, not forwarded, until the fault is lifted (a partition that
  TCP cannot see: the peer's deadlines or keepalives must notice);
- ``refuse``: new connections are closed at once (the service looks down).

TCP delivers what it accepts, so "drop" on a byte stream is a reset or a partition, which is
what a gRPC client sees of a lossy link. Counts of what was injected are kept (``stats``).
Run as a process for chaos runs: ``python -m services.common.faultproxy --target HOST:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import socket
import struct
import threading
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Faults:
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    reset_rate: float = 0.0
    blackhole: bool = False
    refuse: bool = False

    def __post_init__(self) -> None:
        if self.delay_ms < 0 or self.jitter_ms < 0:
            raise ValueError(f"delay_ms and jitter_ms must be >= 0, got {self.delay_ms}, {self.jitter_ms}")
        if not 0.0 <= self.reset_rate <= 1.0:
            raise ValueError(f"reset_rate must be in [0, 1], got {self.reset_rate}")


@dataclass
class FaultStats:
    connections: int = 0
    refused: int = 0
    resets: int = 0
    chunks: int = 0
    bytes: int = 0
    delayed_s: float = 0.0
    held_chunks: int = 0


@dataclass
class FaultProxy:
    """Forward ``127.0.0.1:<port>`` to ``target`` (``host:port``) with injected faults."""

    target: str
    faults: Faults = field(default_factory=Faults)
    seed: int = 0
    stats: FaultStats = field(default_factory=FaultStats)
    port: int = 0

    def __post_init__(self) -> None:
        host, _, port = self.target.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"target must be host:port, got {self.target!r}")
        self._target = (host, int(port))
        self._rng = random.Random(self.seed)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._lifted = None  # asyncio.Event, set while not blackholed
        self._writers: set[asyncio.StreamWriter] = set()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ control (any thread)
    def start(self) -> FaultProxy:
        self._thread = threading.Thread(target=self._run, name=f"faultproxy-{self.target}", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fault proxy did not start")
        return self

    def set(self, faults: Faults) -> None:
        """Change the faults from now on (a lifted blackhole releases the held chunks)."""
        self.faults = faults
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._apply_blackhole)

    def reset_all(self) -> int:
        """Reset every open connection now; returns how many."""
        done = threading.Event()
        count = [0]

        def go() -> None:
            count[0] = len(self._writers)
            for w in list(self._writers):
                self._reset(w)
            done.set()

        assert self._loop is not None
        self._loop.call_soon_threadsafe(go)
        done.wait(10)
        return count[0]

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    # ------------------------------------------------------------------ event loop
    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        self._lifted = asyncio.Event()
        self._apply_blackhole()
        self._server = self._loop.run_until_complete(asyncio.start_server(self._accept, "127.0.0.1", self.port))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._server.close()
            for w in list(self._writers):
                w.close()
            self._loop.close()

    def _apply_blackhole(self) -> None:
        if self.faults.blackhole:
            self._lifted.clear()
        else:
            self._lifted.set()

    def _reset(self, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:  # SO_LINGER 0: close sends RST, not FIN
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
        self._writers.discard(writer)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        if self.faults.refuse:
            self.stats.refused += 1
            self._reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            self.stats.refused += 1
            self._reset(writer)
            return
        self._writers.update((writer, up_writer))
        pair = (writer, up_writer)
        await asyncio.gather(self._pipe(reader, up_writer, pair), self._pipe(up_reader, writer, pair),
                             return_exceptions=True)
        for w in pair:
            if w in self._writers:
                self._writers.discard(w)
                w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pair) -> None:
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            f = self.faults
            if not self._lifted.is_set():
                self.stats.held_chunks += 1
                await self._lifted.wait()
            if f.delay_ms or f.jitter_ms:
                wait = (f.delay_ms + self._rng.uniform(0, f.jitter_ms)) / 1000.0
                self.stats.delayed_s += wait
                await asyncio.sleep(wait)
            if f.reset_rate and self._rng.random() < f.reset_rate:
                self.stats.resets += 1
                for w in pair:
                    self._reset(w)
                return
            self.stats.chunks += 1
            self.stats.bytes += len(chunk)
            writer.write(chunk)
            await writer.drain()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="host:port to forward to")
    parser.add_argument("--port", type=int, default=0, help="loopback port to listen on (0: a free one)")
    parser.add_argument("--port-file", default=None, help="write the port here once listening")
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    parser.add_argument("--reset-rate", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    ns = parser.parse_args()
    try:
        faults = Faults(ns.delay_ms, ns.jitter_ms, ns.reset_rate)
        proxy = FaultProxy(ns.target, faults, ns.seed, port=ns.port).start()
    except ValueError as err:
        parser.error(str(err))
    if ns.port_file:
        from pathlib import Path

        Path(ns.port_file).write_text(str(proxy.port))
    print(f"fault proxy {proxy.address} -> {ns.target} ({faults})", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        proxy.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
