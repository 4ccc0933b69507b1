"""The TLS flags of the SGS, router and trainer processes: bad combinations and missing files are
refused by the parser, before anything starts."""

from __future__ import annotations

import argparse
from pathlib import Path

import grpc
import pytest

from services.common.certs import TlsFiles, make_ca, make_site_cert, open_channel, site_files
from services.generation import __main__ as sgs_main
from services.generation import router_main
from services.run import __main__ as trainer_main

SGS_ARGS = ["--config", "c.json", "--model", "m"]
ROUTER_ARGS = [*SGS_ARGS, "--instances", "127.0.0.1:1"]
TRAINER_ARGS = ["--config", "c.json", "--model", "m", "--sgs", "127.0.0.1:1",
                "--run-dir", "r", "--reward-membership", "w.json"]
SERVERS = [pytest.param(sgs_main.main, SGS_ARGS, id="sgs"), pytest.param(router_main.main, ROUTER_ARGS, id="router")]


def _parser_error(main, argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("main,base", SERVERS)
@pytest.mark.parametrize("flags", [["--tls-dir", "d"], ["--tls-site", "gen-site"]])
def test_server_tls_flags_go_together(main, base, flags, capsys):
    assert "--tls-dir and --tls-site go together" in _parser_error(main, [*base, *flags], capsys)


@pytest.mark.parametrize("main,base", SERVERS)
def test_server_missing_tls_files_are_named(main, base, tmp_path: Path, capsys):
    err = _parser_error(main, [*base, "--tls-dir", str(tmp_path), "--tls-site", "gen-site"], capsys)
    assert "TLS files missing" in err and str(tmp_path / "ca.pem") in err and str(tmp_path / "gen-site.key") in err


def test_trainer_sgs_tls_needs_tls_dir(capsys):
    assert "--sgs-tls needs --tls-dir" in _parser_error(trainer_main.main, [*TRAINER_ARGS, "--sgs-tls"], capsys)


def test_trainer_sgs_tls_missing_files_are_named(tmp_path: Path, capsys):
    argv = [*TRAINER_ARGS, "--sgs-tls", "--tls-dir", str(tmp_path), "--training-site", "train-site"]
    assert str(tmp_path / "train-site.pem") in _parser_error(trainer_main.main, argv, capsys)


def test_trainer_tls_files_for_relays_and_the_sgs(tmp_path: Path):
    ca_cert, ca_key = make_ca(tmp_path)
    make_site_cert(tmp_path, "train-site", [], ca_cert, ca_key)
    parser = argparse.ArgumentParser()
    ns = argparse.Namespace(tls_dir=str(tmp_path), training_site="train-site", sgs_tls=False)
    assert trainer_main.tls_files(parser, ns) == (site_files(tmp_path, "train-site"), None)  # relays only, as before
    ns.sgs_tls = True
    relay_tls, sgs_tls = trainer_main.tls_files(parser, ns)
    expected = TlsFiles(tmp_path / "ca.pem", tmp_path / "train-site.pem", tmp_path / "train-site.key")
    assert sgs_tls == relay_tls == expected
    ns.tls_dir, ns.sgs_tls = "", False
    assert trainer_main.tls_files(parser, ns) == (None, None)


def test_open_channel_is_plaintext_without_tls_and_reads_the_files_with_it(tmp_path: Path):
    open_channel("127.0.0.1:1", None, []).close()
    with pytest.raises(FileNotFoundError, match="TLS files missing"):
        open_channel("127.0.0.1:1", site_files(tmp_path, "x"), [])
    ca_cert, ca_key = make_ca(tmp_path)
    files = make_site_cert(tmp_path, "x", [], ca_cert, ca_key)
    channel = open_channel("127.0.0.1:1", TlsFiles(files.ca, files.cert, files.key, server_name="x"), [])
    assert isinstance(channel, grpc.Channel)
    channel.close()
