"""``host:port`` addresses given to a service at run time (router membership, relay chains)."""

from __future__ import annotations

MAX_ADDRESS_CHARS = 256


def parse_address(address: str) -> tuple[str, int]:
    """``host:port`` -> (host, port); ``ValueError`` naming what is wrong."""
    host, sep, port = address.rpartition(":")
    if (not sep or not host or len(address) > MAX_ADDRESS_CHARS
            or any(c.isspace() or not c.isprintable() for c in address)):
        raise ValueError(f"address must be host:port, got {address[:80]!r}")
    if not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"port of {address!r} must be an integer in [1, 65535]")
    return host, int(port)
