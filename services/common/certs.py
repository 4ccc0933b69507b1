"""TLS for cross-site weight links: a local CA, per-site certificates, gRPC credentials.

``braid certs --sites FILE`` makes ``<tls.dir>/ca.pem`` (+ ``ca.key``) and, per site,
``<site>.pem`` / ``<site>.key`` (``site_files``): an ECDSA P-256 certificate signed by the CA, valid for server
*and* client authentication, with the site's host (IP or DNS name), ``localhost``,
``127.0.0.1`` and the site name as subject alternative names. A relay's cross-site port
requires a client certificate signed by the same CA (mutual TLS): a client without one is
refused during the handshake (UNAVAILABLE on its side). Loopback traffic inside a site stays
plaintext (``tls.enabled`` false by default). The Generation service (SGS instances and the
router) serves mutual TLS the same way with ``--tls-dir/--tls-site`` (``add_tls_args``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import grpc

CERT_DAYS = 365


@dataclass(frozen=True)
class TlsFiles:
    """The PEM files one process needs for mutual TLS."""

    ca: Path
    cert: Path
    key: Path
    server_name: str = ""  # as a client: expect this name in the peer's certificate (default: the address's host)

    def read(self) -> tuple[bytes, bytes, bytes]:
        missing = [str(p) for p in (self.ca, self.cert, self.key) if not p.exists()]
        if missing:
            raise FileNotFoundError(f"TLS files missing: {missing}; run `braid certs --sites <file>`")
        return self.ca.read_bytes(), self.cert.read_bytes(), self.key.read_bytes()


def server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    ca, cert, key = tls.read()
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)


def channel_credentials(tls: TlsFiles) -> grpc.ChannelCredentials:
    ca, cert, key = tls.read()
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def site_files(directory: str | Path, site: str) -> TlsFiles:
    """``braid certs``' files for ``site`` in ``directory``: the CA, the site's certificate and key."""
    d = Path(directory)
    return TlsFiles(d / "ca.pem", d / f"{site}.pem", d / f"{site}.key")


def open_channel(address: str, tls: TlsFiles | None, options: list[tuple[str, object]]) -> grpc.Channel:
    """A gRPC channel to ``address`` with ``options``: plaintext without ``tls``, else mutual TLS
    (expecting ``tls.server_name`` in the peer's certificate when set, else the address's host)."""
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    if tls.server_name:
        options = [*options, ("grpc.ssl_target_name_override", tls.server_name)]
    return grpc.secure_channel(address, channel_credentials(tls), options=options)


def add_tls_args(parser: argparse.ArgumentParser) -> None:
    """``--tls-dir DIR --tls-site NAME`` (both or neither): serve mutual TLS with DIR/NAME.pem."""
    parser.add_argument("--tls-dir", default="", help="`braid certs` directory: serve mutual TLS (needs --tls-site)")
    parser.add_argument("--tls-site", default="", help="this process's site: its certificate is <tls-dir>/<site>.pem")


def tls_from_args(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> TlsFiles | None:
    """The files ``add_tls_args``' flags name, checked now (``parser.error`` on a lone flag or a
    missing file, naming it); None without the flags."""
    if bool(ns.tls_dir) != bool(ns.tls_site):
        parser.error("--tls-dir and --tls-site go together (mutual TLS needs the CA and this site's certificate)")
    if not ns.tls_dir:
        return None
    tls = site_files(ns.tls_dir, ns.tls_site)
    try:
        tls.read()
    except FileNotFoundError as err:
        parser.error(str(err))
    return tls


def _name(common: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "braid"), x509.NameAttribute(NameOID.COMMON_NAME, common)
    ])


def _write_key(key, path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


def _sans(names: list[str]):
    from cryptography import x509

    out, seen = [], set()
    for n in names:
        if n in seen:
            continue
        seen.add(n)
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            out.append(x509.DNSName(n))
    return out


def make_ca(out_dir: Path):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("braid local CA")).issuer_name(_name("braid local CA"))
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=CERT_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .sign(key, hashes.SHA256())
    )
    from cryptography.hazmat.primitives import serialization

    (out_dir / "ca.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, out_dir / "ca.key")
    return cert, key


def make_site_cert(out_dir: Path, site: str, hosts: list[str], ca_cert, ca_key) -> TlsFiles:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(site)).issuer_name(ca_cert.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=CERT_DAYS))
        .add_extension(x509.SubjectAlternativeName(_sans([*hosts, site, "localhost", "127.0.0.1"])), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    (out_dir / f"{site}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, out_dir / f"{site}.key")
    return site_files(out_dir, site)


def make_certs(sites_file: str | Path, out_dir: str | Path | None = None) -> dict[str, TlsFiles]:
    """A fresh CA and one certificate per site of ``sites_file``; returns the files per site."""
    from services.common.sites import load_sites

    sites = load_sites(sites_file)
    out = Path(out_dir or sites.tls.dir)
    out.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = make_ca(out)
    return {s.name: make_site_cert(out, s.name, [s.host], ca_cert, ca_key) for s in sites.sites}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="braid certs", description="make a local CA and per-site TLS certificates")
    parser.add_argument("--sites", required=True, help="site config (deploy/sites/*.yaml)")
    parser.add_argument("--out", help="output directory (default: the site file's tls.dir)")
    ns = parser.parse_args(argv)
    files = make_certs(ns.sites, ns.out)
    for site, f in files.items():
        print(f"{site}: cert {f.cert} key {f.key} (CA {f.ca})")
    return 0
