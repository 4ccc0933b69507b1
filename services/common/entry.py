"""What every ``python -m services.X`` server process shares: its address flags, its log format,
the port file it publishes once serving, and serving until SIGTERM/SIGINT.

The launcher (``flows.processes``) and the tests start a server with ``--port 0`` and wait for
``--port-file`` to appear: the file is written atomically and only after ``server.start()``, so
its presence means the port accepts calls. These helpers import nothing heavy: ``--help`` stays
instant and a bad flag fails before any model loads.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from services.common.atomic import write_text_atomic


def add_serve_args(parser: argparse.ArgumentParser, *, host_help: str | None = None,
                   port_file_help: str = "write the bound port here once serving") -> None:
    """``--host`` (default 127.0.0.1), ``--port`` (0 picks a free port) and ``--port-file``."""
    parser.add_argument("--host", default="127.0.0.1", help=host_help)
    parser.add_argument("--port", type=int, default=0, help="0 = pick a free port")
    parser.add_argument("--port-file", help=port_file_help)


def check_port(parser: argparse.ArgumentParser, port: int, flag: str = "--port") -> None:
    """``parser.error`` (exit 2) unless ``port`` is a port number (0 picks a free one)."""
    if not 0 <= port <= 65535:
        parser.error(f"{flag} must be a port number (0..65535), not {port}")


def setup_logging(name: str) -> None:
    """INFO logs to stderr as ``<time> <name> <level> <message>``: a run's logs say which process spoke."""
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(levelname)s %(message)s")


def publish_port(port_file: str | Path | None, port: int, tls_port: int = 0) -> None:
    """Write ``port`` (and ``tls_port`` after a space when there is one) to ``port_file`` atomically;
    nothing without a file. Call it after the server started: the file's presence means serving."""
    if port_file:
        write_text_atomic(port_file, f"{port} {tls_port}" if tls_port else str(port))


def serve_until_signal(interval_s: float, check: Callable[[], int | None] | None = None) -> int | None:
    """Block until SIGTERM or SIGINT (then None), calling ``check`` every ``interval_s`` seconds:
    housekeeping, or a health check that ends the wait by returning an exit code. Call it from the
    main thread (signal handlers can only be installed there)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(interval_s):
        if check is not None and (code := check()) is not None:
            return code
    return None


def exit_process(code: int | None) -> NoReturn:
    """End a service process whose ``main`` returned: logs and standard streams flushed, then
    ``os._exit(code)``, without the interpreter's finalization. By then the process closed what it
    owns (servers stopped, engines closed, files and shared memory written or removed); tearing
    down the modules of torch, transformers and vLLM still took 2-5 s of CPU per process here
    (3.5-4.6 s for a process that imported vLLM, measured with ``os._exit`` against a normal exit),
    while the launcher waited for it at the end of every run. ``atexit`` handlers do not run: a
    service must not leave work to them (a ``main`` that raises exits the normal way)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken pipe: nothing left to say on it
            stream.flush()
    os._exit(code or 0)
