"""``python -m services.weights`` (``braid relay``): run one weight relay process."""

from __future__ import annotations

import argparse
import logging
import shutil
import sys

from services.common.entry import add_serve_args, check_port, publish_port, serve_until_signal, setup_logging

STALE_INCOMING_S = 60.0  # an arriving version with no progress this long is dropped


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="braid relay", description="weight relay (parameter service) process")
    add_serve_args(parser, host_help="plaintext address for this site's processes",
                   port_file_help="write 'port[ tls_port]' here once serving")
    parser.add_argument("--id", default="", help="relay id in logs (default host:port)")
    parser.add_argument("--keep", type=int, default=2, help="versions kept (K)")
    parser.add_argument("--no-shm", action="store_true",
                        help="keep versions in private memory (no same-host fast path)")
    parser.add_argument("--max-message-mb", type=int, default=256)
    parser.add_argument("--tls-host", help="serve other sites here (mutual TLS); needs --tls-dir and --site")
    parser.add_argument("--tls-port", type=int, default=0)
    parser.add_argument("--tls-dir",
                        help="directory made by `braid certs` (with --site: this relay's certificate, also as a "
                             "client)")
    parser.add_argument("--site", default="", help="this relay's site (selects <tls-dir>/<site>.pem)")
    parser.add_argument("--upstream", default="", help="catch up from this relay at start")
    parser.add_argument("--data-path", choices=("tcp", "grpc"), default="tcp",
                        help="how this relay forwards versions to its peers (tcp: the raw-TCP data channel)")
    parser.add_argument("--data-port", type=int, default=0,
                        help="raw-TCP data channel port on --host (0 = pick a free one)")
    parser.add_argument("--tls-data-port", type=int, default=0,
                        help="mutual-TLS data channel port on --tls-host (0 = free)")
    parser.add_argument("--advertise-data-port", type=int, default=0,
                        help="name this port in grants instead of --data-port (a NAT, port forward or proxy in front)")
    parser.add_argument("--advertise-tls-data-port", type=int, default=0,
                        help="name this port in grants instead of --tls-data-port (a NAT, port forward or proxy in "
                             "front)")
    parser.add_argument("--no-data-channel", action="store_true",
                        help="serve no raw-TCP data channel (clients fall back to gRPC streams)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    ns = parser.parse_args(argv)
    if ns.keep < 1:
        parser.error("--keep must be >= 1")
    for flag in ("data_port", "tls_data_port", "advertise_data_port", "advertise_tls_data_port"):
        check_port(parser, getattr(ns, flag), f"--{flag.replace('_', '-')}")
    setup_logging("relay")

    from services.common.certs import site_files
    from services.weights.blob import private_shm_dir
    from services.weights.server import RelayServicer, chain_problem, create_server
    from services.weights.store import VersionStore

    if ns.upstream and (why := chain_problem(_chain_request(ns.upstream))):
        parser.error(f"--upstream: {why}")
    tls = None
    if ns.tls_host and not (ns.tls_dir and ns.site):
        parser.error("--tls-host needs --tls-dir and --site")
    if ns.tls_dir and ns.site:
        tls = site_files(ns.tls_dir, ns.site)
        tls.read()  # fail now, naming the missing files
    shm_dir = None if ns.no_shm else private_shm_dir("relay")
    store = VersionStore(ns.keep, shm_dir)
    servicer = RelayServicer(store, ns.id, tls=tls, max_message_mb=ns.max_message_mb, data_path=ns.data_path)
    if not ns.no_data_channel:
        servicer.attach_data_plane(ns.host, ns.tls_host if tls is not None else None, ns.data_port, ns.tls_data_port,
                                   advertise=(ns.advertise_data_port, ns.advertise_tls_data_port))
    server, port, tls_port = create_server(
        servicer, f"{ns.host}:{ns.port}", max_message_mb=ns.max_message_mb,
        tls_address=f"{ns.tls_host}:{ns.tls_port}" if ns.tls_host else None, tls=tls,
    )
    servicer.relay_id = ns.id or f"{ns.host}:{port}"
    server.start()
    if ns.upstream:
        servicer.SetChain(_chain_request(ns.upstream), None)
    publish_port(ns.port_file, port, tls_port)
    logging.info("relay %s serving on %s:%d%s (keep %d, shm %s, data channel %s)", servicer.relay_id, ns.host, port,
                 f", TLS on {ns.tls_host}:{tls_port}" if tls_port else "", ns.keep, shm_dir is not None,
                 _data_ports(servicer.data)
                 if servicer.data is not None else "off")

    def drop_stale() -> None:
        for v in store.drop_stale(STALE_INCOMING_S):
            logging.warning("dropped version %d: no progress for %.0fs", v, STALE_INCOMING_S)

    serve_until_signal(1.0, drop_stale)
    server.stop(grace=2).wait()
    servicer.close()
    store.close()
    if shm_dir is not None:
        shutil.rmtree(shm_dir, ignore_errors=True)
    return 0


def _data_ports(data) -> str:
    bound, named = (data.server.port, data.server.tls_port), data.ports
    text = f"port {bound[0]}" + (f", TLS {bound[1]}" if bound[1] else "")
    return text + (f" (grants name {named[0]}, TLS {named[1]})" if named != bound else "")


def _chain_request(upstream: str):
    from services.proto import braid_pb2 as pb

    return pb.ChainRequest(epoch=0, upstream=upstream)


if __name__ == "__main__":
    sys.exit(main())
