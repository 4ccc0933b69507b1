"""``python -m services.generation``: run one Stream Generation Service process.

Serves plaintext on ``--host:--port``; with ``--tls-dir DIR --tls-site NAME`` (both or neither)
the port serves mutual TLS only, with ``DIR/ca.pem`` and ``DIR/NAME.pem``/``.key`` (``braid
certs``), for callers at other sites. Missing files stop it at start, naming them.

One process serves instance ``--instance I``, or with ``--instances N`` (engine ``emulated``
only) instances I .. I+N-1, each a separate SGS on its own port (``services.generation.instances``):
instance I+k binds ``--port`` + k (0: any free port), or the k-th of ``--ports P0,P1,...``; it pulls
from the k-th relay of ``--relay A,B,...`` round-robin; ``--port-file`` lists the bound ports one
per line in instance order once all of them serve.
"""

from __future__ import annotations

import argparse

from services.common.certs import add_tls_args, tls_from_args
from services.common.entry import add_serve_args, check_port, exit_process, setup_logging

MAX_INSTANCES = 256  # instances one process may serve (emulated; measured up to this many: bench/sgs_multi.py)


def _int_list(flag: str, text: str) -> list[int]:
    try:
        values = [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if any(c < 0 for c in values):
        raise argparse.ArgumentTypeError(f"{flag} must be >= 0, got {text!r}")
    return values


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="braid-sgs", description="Stream Generation Service (gRPC)")
    parser.add_argument("--config", required=True, help="resolved run config (config.json)")
    parser.add_argument("--model", required=True, help="local checkpoint dir to serve")
    add_serve_args(parser, port_file_help="write the bound port(s) here once serving, one line per instance")
    parser.add_argument("--instance", type=int, default=0,
                        help="instance index (the first one with --instances; selects generation.step_delay_ms)")
    parser.add_argument("--instances", type=int, default=1,
                        help="serve this many instances, each on its own port (engine 'emulated' only)")
    parser.add_argument("--ports", type=lambda t: _int_list("--ports", t), default=None,
                        help="one port per instance, comma-separated (0 = any free; overrides --port)")
    parser.add_argument("--relay", default="",
                        help="local weight relay host:port (PullWeights); a comma list is dealt round-robin")
    parser.add_argument(
        "--cpus", default=None, type=lambda t: _int_list("--cpus", t),
        help="CPU ids to pin to, e.g. 0,1 (overrides generation.cpus; scale-out places added instances)",
    )
    add_tls_args(parser)
    return parser


def _ports(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> list[int]:
    """Each instance's port, checked (``parser.error`` on a bad count or range)."""
    if not 1 <= ns.instances <= MAX_INSTANCES:
        parser.error(f"--instances must be in [1, {MAX_INSTANCES}], got {ns.instances}")
    if ns.ports is not None:
        if len(ns.ports) != ns.instances:
            parser.error(f"--ports lists {len(ns.ports)} ports for {ns.instances} instances")
        for port in ns.ports:
            check_port(parser, port, "--ports")
        return ns.ports
    check_port(parser, ns.port)
    if ns.port:
        check_port(parser, ns.port + ns.instances - 1, f"--port + --instances - 1 ({ns.port} + {ns.instances} - 1)")
    from services.generation.instances import instance_ports

    return instance_ports(ns.port, ns.instances)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    ns = parser.parse_args(argv)
    tls = tls_from_args(parser, ns)
    ports = _ports(parser, ns)
    setup_logging("sgs")

    from services.common.affinity import pin_cpus
    from services.common.config import load_config

    run_cfg = load_config(ns.config)
    cfg = run_cfg.generation
    if ns.instances > 1 and cfg.engine != "emulated":
        parser.error(f"--instances {ns.instances}: only generation.engine 'emulated' serves several instances in one "
                     f"process; engine {cfg.engine!r} holds a model per instance: start one process per instance")
    cpus = cfg.cpus if ns.cpus is None else ns.cpus
    what = f"SGS instance {ns.instance}" if ns.instances == 1 else \
        f"SGS instances {ns.instance}..{ns.instance + ns.instances - 1}"
    pin_cpus(cpus, what)  # before torch creates its threads

    from services.generation.instances import serve

    relays = [r.strip() for r in ns.relay.split(",") if r.strip()]
    return serve(run_cfg, ns.model, ns.instance, ports, host=ns.host, relays=relays, tls=tls,
                 port_file=ns.port_file)


if __name__ == "__main__":
    exit_process(main())
