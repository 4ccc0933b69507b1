"""``python -m services.reward``: run one reward worker process (the Reward service).

Reads a run config (``--config``, plus ``--set key=value`` overrides; its ``reward`` section, and
``agentic`` for the rule kind's environments); builds the reward kind first, so a model kind
without a loadable model refuses to start (exit 2) rather than failing every request; serves
plaintext on ``--host:--port`` (0 picks a free port, written to ``--port-file`` once serving).
Stops on SIGTERM/SIGINT: new and queued requests get UNAVAILABLE (callers retry elsewhere), then
the server stops.
"""

from __future__ import annotations

import argparse
import logging
import sys

from services.common.entry import (
    add_serve_args,
    check_port,
    exit_process,
    publish_port,
    serve_until_signal,
    setup_logging,
)

STOP_GRACE_S = 2.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="braid reward-worker", description="reward worker (gRPC Reward service)")
    parser.add_argument("--config", default=None,
                        help="run config (YAML or the resolved config.json); default: built-in defaults")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config override, e.g. reward.threads=4")
    add_serve_args(parser)
    parser.add_argument("--worker-id", default="", help="worker id in logs, Health and replies (default host:port)")
    ns = parser.parse_args(argv)
    check_port(parser, ns.port)
    setup_logging("reward-worker")

    from services.common.config import ConfigError, load_config
    from services.reward.protocol import RewardUnavailable
    from services.reward.registry import REWARD_KINDS

    try:
        cfg = load_config(ns.config, ns.set)
    except ConfigError as err:
        parser.error(str(err))
    try:
        fn = REWARD_KINDS[cfg.reward.kind](cfg)
    except RewardUnavailable as err:
        print(f"reward worker: {err}", file=sys.stderr)
        return 2

    from services.reward.server import RewardServicer, create_server
    from services.reward.worker import RewardWorker

    rc = cfg.reward
    worker = RewardWorker(rc, fn)
    server, port = create_server(RewardServicer(worker), f"{ns.host}:{ns.port}", threads=rc.threads,
                                 max_queue=rc.max_queue)
    worker.worker_id = ns.worker_id or f"{ns.host}:{port}"
    server.start()
    publish_port(ns.port_file, port)
    logging.info("reward worker %s serving on %s:%d (kind %s, %d threads, max_queue %d, latency %s)", worker.worker_id,
                 ns.host, port, rc.kind, rc.threads, rc.max_queue, rc.latency.model_dump())

    serve_until_signal(1.0)
    worker.shutdown()
    server.stop(grace=STOP_GRACE_S).wait()
    logging.info("reward worker %s stopped after %d scores", worker.worker_id, worker.health().served)
    return 0


if __name__ == "__main__":
    exit_process(main())
