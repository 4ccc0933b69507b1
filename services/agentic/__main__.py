"""``python -m services.agentic``: run one environment worker process (the Environment service).

Reads the ``agentic`` section of a run config (``--config``, plus ``--set key=value``
overrides); serves plaintext on ``--host:--port`` (0 picks a free port, written to
``--port-file`` once serving). Stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

EVICT_EVERY_S = 1.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="braid env-worker", description="environment worker (gRPC Environment service)")
    parser.add_argument("--config", default=None, help="run config (YAML or the resolved config.json); default: built-in defaults")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override, e.g. agentic.latency.kind=fixed")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = pick a free port")
    parser.add_argument("--port-file", help="write the bound port here once serving")
    parser.add_argument("--id", default="", help="worker id in logs and Health (default host:port)")
    ns = parser.parse_args(argv)
    if not 0 <= ns.port <= 65535:
        parser.error(f"--port must be a port number (0..65535), not {ns.port}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s env-worker %(levelname)s %(message)s")

    from services.common.config import ConfigError, load_config

    try:
        cfg = load_config(ns.config, ns.set).agentic
    except ConfigError as err:
        parser.error(str(err))

    from services.agentic.server import EnvironmentServicer, create_server
    from services.agentic.sessions import SessionTable

    table = SessionTable(cfg)
    servicer = EnvironmentServicer(table)
    server, port = create_server(servicer, f"{ns.host}:{ns.port}", threads=cfg.worker_threads)
    servicer.worker_id = ns.id or f"{ns.host}:{port}"
    server.start()
    if ns.port_file:
        tmp = Path(ns.port_file + ".tmp")
        tmp.write_text(str(port))
        tmp.rename(ns.port_file)
    logging.info("environment worker %s serving on %s:%d (kinds %s, latency %s)", servicer.worker_id, ns.host, port,
                 table.kinds(), cfg.latency.model_dump())

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(EVICT_EVERY_S):
        if evicted := table.evict_idle():
            logging.info("closed %d idle sessions", len(evicted))
    table.shutdown()
    server.stop(grace=2).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
