"""``python -m services.agentic``: run one environment worker process (the Environment service).

Reads the ``agentic`` section of a run config (``--config``, plus ``--set key=value``
overrides); serves plaintext on ``--host:--port`` (0 picks a free port, written to
``--port-file`` once serving). Stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import logging
import sys

from services.common.entry import add_serve_args, check_port, publish_port, serve_until_signal, setup_logging

EVICT_EVERY_S = 1.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="braid env-worker",
                                     description="environment worker (gRPC Environment service)")
    parser.add_argument("--config", default=None,
                        help="run config (YAML or the resolved config.json); default: built-in defaults")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config override, e.g. agentic.latency.kind=fixed")
    add_serve_args(parser)
    parser.add_argument("--id", default="", help="worker id in logs and Health (default host:port)")
    ns = parser.parse_args(argv)
    check_port(parser, ns.port)
    setup_logging("env-worker")

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
    publish_port(ns.port_file, port)
    logging.info("environment worker %s serving on %s:%d (kinds %s, latency %s)", servicer.worker_id, ns.host, port,
                 table.kinds(), cfg.latency.model_dump())

    def evict() -> None:
        if evicted := table.evict_idle():
            logging.info("closed %d idle sessions", len(evicted))

    serve_until_signal(EVICT_EVERY_S, evict)
    table.shutdown()
    server.stop(grace=2).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
