"""``python -m services.generation``: run one Stream Generation Service process.

Serves plaintext on ``--host:--port``; with ``--tls-dir DIR --tls-site NAME`` (both or neither)
the port serves mutual TLS only, with ``DIR/ca.pem`` and ``DIR/NAME.pem``/``.key`` (``braid
certs``), for callers at other sites. Missing files stop it at start, naming them.
"""

from __future__ import annotations

import argparse
import logging
import sys

from services.common.certs import add_tls_args, tls_from_args
from services.common.entry import add_serve_args, publish_port, serve_until_signal, setup_logging


def _cpu_list(text: str) -> list[int]:
    try:
        cpus = [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--cpus must be comma-separated CPU ids, got {text!r}") from None
    if any(c < 0 for c in cpus):
        raise argparse.ArgumentTypeError(f"--cpus must be >= 0, got {text!r}")
    return cpus


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="braid-sgs", description="Stream Generation Service (gRPC)")
    parser.add_argument("--config", required=True, help="resolved run config (config.json)")
    parser.add_argument("--model", required=True, help="local checkpoint dir to serve")
    add_serve_args(parser)
    parser.add_argument("--instance", type=int, default=0, help="instance index (selects generation.step_delay_ms)")
    parser.add_argument("--relay", default="", help="this instance's local weight relay host:port (PullWeights)")
    parser.add_argument(
        "--cpus", default=None, type=_cpu_list,
        help="CPU ids to pin to, e.g. 0,1 (overrides generation.cpus; scale-out places added instances)",
    )
    add_tls_args(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    ns = parser.parse_args(argv)
    tls = tls_from_args(parser, ns)
    setup_logging("sgs")

    from services.common.affinity import pin_cpus
    from services.common.config import load_config

    run_cfg = load_config(ns.config)
    cfg = run_cfg.generation
    cpus = cfg.cpus if ns.cpus is None else ns.cpus
    pin_cpus(cpus, f"SGS instance {ns.instance}")  # before torch creates its threads

    from services.generation.core import GenerationCore
    from services.generation.engine import create_engine
    from services.generation.server import GenerationServicer, create_server

    # trainer.lora set: the trainer pushes adapters only, and this instance serves base + adapter.
    engine = create_engine(cfg.engine, ns.model, cfg, step_delay_s=cfg.delay_of(ns.instance) / 1000.0,
                           adapter=run_cfg.trainer.lora)
    genlog = None
    if cfg.genlog:
        from services.generation.genlog_writer import GenLogWriter

        genlog = GenLogWriter(cfg.genlog, ns.model, ns.instance)
    core = GenerationCore(
        engine, max_inflight=cfg.max_inflight, default_max_new_tokens=cfg.max_new_tokens, admission=cfg.admission,
        on_finished=genlog.record if genlog else None,
    )
    relay = None
    if ns.relay:
        from services.weights.client import RelayClient

        relay = RelayClient(ns.relay, max_message_mb=run_cfg.weights.max_message_mb,
                            data_path=run_cfg.weights.data_path)
    servicer = GenerationServicer(
        core, cfg, vocab_size=engine.vocab_size, max_positions=engine.max_positions, relay=relay,
        relay_streams=run_cfg.weights.streams, pull_wait_s=run_cfg.weights.pull_wait_s,
    )
    # One thread per open call (synchronous gRPC): a streaming Generate call holds its thread while
    # it waits, so with fewer threads than open calls, control calls (PullWeights, Health) queue
    # behind Generate calls that wait for the very weights PullWeights would bring: a deadlock seen
    # in bounded mode with partial rollout (one call per resumed sample). Callers keep at most
    # ``max_inflight`` samples, hence calls, per instance open; 16 threads more serve control calls.
    server, port = create_server(servicer, f"{ns.host}:{ns.port}", max_message_mb=cfg.max_message_mb,
                                 workers=cfg.max_inflight + 16, tls=tls)
    core.start()
    server.start()
    if relay is not None and run_cfg.weights.sgs_auto_pull_s > 0:
        servicer.start_auto_pull(run_cfg.weights.sgs_auto_pull_s)
    publish_port(ns.port_file, port)
    logging.info("serving on %s:%d (engine %s%s%s)", ns.host, port, engine.name,
                 f", LoRA adapter rank {run_cfg.trainer.lora.rank}" if run_cfg.trainer.lora else "",
                 ", mutual TLS" if tls else "")

    def failed() -> int | None:
        if not core.alive():
            logging.error("generation core died: %r", core.error)
            return 1
        if genlog is not None and genlog.error is not None:
            logging.error("generation log failed: %r", genlog.error)
            return 1
        return None

    if (code := serve_until_signal(0.5, failed)) is not None:
        server.stop(grace=1).wait()
        return code
    server.stop(grace=2).wait()
    core.stop()
    engine.close()
    if genlog is not None:
        genlog.close()
        genlog.check()
    return 0


if __name__ == "__main__":
    sys.exit(main())
