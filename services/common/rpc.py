"""gRPC plumbing every Braid service shares: servers, their ports, client channels.

A server is synchronous: a thread pool of ``workers`` threads, each holding one open call, so the
pool is sized per service (open streams plus control calls). Every server rejects undecodable
requests with INVALID_ARGUMENT (``MalformedRequests``) and caps messages in both directions at an
explicit size; clients use the same cap. A port is plaintext, or mutual TLS with ``braid certs``'
files (``services.common.certs``); port 0 binds a free port and the bound one is returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent import futures

import grpc

from services.common.certs import TlsFiles, open_channel, server_credentials
from services.common.malformed import MalformedRequests

MB = 1024 * 1024


def message_options(max_bytes: int) -> list[tuple[str, object]]:
    """Channel/server options capping received and sent messages at ``max_bytes``."""
    return [("grpc.max_receive_message_length", max_bytes), ("grpc.max_send_message_length", max_bytes)]


def new_server(*, workers: int, thread_name_prefix: str, max_message_bytes: int,
               executor: futures.ThreadPoolExecutor | None = None) -> grpc.Server:
    """An unstarted server with ``workers`` RPC threads, malformed requests rejected, messages capped.
    ``executor``: a pool the caller owns and may share between servers (grpcio never shuts a
    server's pool down), used instead of a pool of ``workers`` threads of its own."""
    return grpc.server(
        executor or futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=thread_name_prefix),
        interceptors=[MalformedRequests()],
        options=message_options(max_message_bytes),
    )


def bind(server: grpc.Server, address: str, tls: TlsFiles | None = None, *, label: str = "") -> int:
    """Bind ``address`` (``host:port``; port 0 picks a free one), plaintext or, with ``tls``, mutual
    TLS only; returns the bound port. RuntimeError ``could not bind <address><label>`` on failure
    (gRPC reports a failed bind as port 0, not as an exception)."""
    port = server.add_secure_port(address, server_credentials(tls)) if tls else server.add_insecure_port(address)
    if port == 0:
        raise RuntimeError(f"could not bind {address}{label}")
    return port


def connect(
    address: str, *, max_message_bytes: int, tls: TlsFiles | None = None, options: Sequence[tuple[str, object]] = (),
) -> grpc.Channel:
    """A channel to ``address`` with messages capped like the server's, plus ``options``: plaintext
    without ``tls``, else mutual TLS (``certs.open_channel``)."""
    return open_channel(address, tls, [*message_options(max_message_bytes), *options])
