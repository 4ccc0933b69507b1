"""Ports held for the servers a supervisor starts, across their deaths and restarts.

A server that dies is started again on the port it had (``flows.processes.Supervisor.check``:
relays, the router, SGS processes, environment and reward workers), so that its peers find it
again. Between its death and its restart that port is free, and any process on the machine may
draw it: a bind to port 0 and an outgoing connection take ports from the kernel's ephemeral range,
where a port-0 server's port lies. The restart then fails with "address already in use" (it did in
CI, for a relay killed beside other tests).

``PortReservations`` closes that window. Before a server starts, its supervisor binds the server's
port itself with ``SO_REUSEPORT`` and never listens on it. The server's gRPC listener shares the
port (gRPC servers set ``SO_REUSEPORT`` on Linux) and, as the only listener, gets every connection.
While no server listens, the port stays held: the kernel hands no port-0 bind and no outgoing
connection a port a bound socket holds, and an explicit bind without ``SO_REUSEPORT`` is refused.
The supervisor releases its ports in ``stop_all``. Where ``SO_REUSEPORT`` does not exist, or the
port cannot be bound (another process holds it), nothing is held and the server's own bind decides.
"""

from __future__ import annotations

import logging
import socket

log = logging.getLogger("braid.launcher")


class PortReservations:
    """The ports one supervisor holds for its servers, by (host, port)."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, int], socket.socket] = {}

    def hold(self, host: str, port: int = 0) -> int:
        """Hold ``host:port`` (``port`` 0: a free port the kernel picks) until ``release_all``; return
        the port. A port already held is returned as it is (a restart on it). ``port`` unchanged when
        it cannot be held (see the module's docstring)."""
        if (host, port) in self._held or not hasattr(socket, "SO_REUSEPORT"):
            return port
        try:
            family, kind, proto, _, address = socket.getaddrinfo(
                host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
            sock = socket.socket(family, kind, proto)
        except OSError as err:
            log.debug("cannot hold %s:%d: %s", host, port, err)
            return port
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(address)
        except OSError as err:
            sock.close()
            log.debug("cannot hold %s:%d: %s", host, port, err)
            return port
        bound = sock.getsockname()[1]
        self._held[(host, bound)] = sock
        return bound

    def held(self) -> list[tuple[str, int]]:
        return list(self._held)

    def release_all(self) -> None:
        for sock in self._held.values():
            sock.close()
        self._held.clear()
