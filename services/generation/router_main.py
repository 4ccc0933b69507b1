"""``python -m services.generation.router_main`` (``braid router``): run the SGS router process.

Waits for the instances, loads what the configured policy needs (the PTL profile for
``streamrl*``, checked against the served model; the length estimator when
``generation.ranker_dir`` is set), then serves ``Generation`` on one port: plaintext, or with
``--tls-dir DIR --tls-site NAME`` (both or neither) mutual TLS only, with ``DIR/ca.pem`` and
``DIR/NAME.pem``/``.key`` (``braid certs``), for callers at other sites. Its own calls to its
instances (same site) stay plaintext.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from services.common.certs import add_tls_args, tls_from_args
from services.common.entry import add_serve_args, publish_port, serve_until_signal, setup_logging

CPU_PROFILE = "cpu-local-braid-tiny"


def load_spec(cfg, model_dir: str):
    """The instance cost model for cost-aware policies: the configured (or shipped CPU) profile,
    refused if fitted to another model; limits are those of the live instances. Emulated instances
    without a configured profile: the profile they wait out (``generation.emulation.profile``, e.g.
    an H20 serving Qwen2.5-7B), not the served checkpoint's CPU profile: a policy must plan with
    the step costs the instances really have."""
    from services.generation.scheduling.models import spec_from_hf_config
    from services.generation.scheduling.profiles import load_profile, shipped_profile

    if cfg.engine == "emulated" and cfg.dispatch.profile is None:
        from services.generation.emulated_engine import resolve_profile

        profile = resolve_profile(cfg.emulation.profile)
    else:
        config = json.loads((Path(model_dir) / "config.json").read_text())
        path = cfg.dispatch.profile or shipped_profile(CPU_PROFILE)
        profile = load_profile(path, model=spec_from_hf_config(Path(model_dir).name, config))
    return profile.instance_spec(max_batch=cfg.max_inflight, kv_capacity_tokens=cfg.num_blocks * cfg.page_size)


def router_workers(run_cfg) -> int:
    """RPC threads the router serves with: one per Generate call it may hold open (synchronous gRPC: a
    streaming call holds its thread until its last sample), plus the control calls'
    (``instances.rpc_workers``). Callers keep at most one call per sample the instances admit
    (``generation.max_inflight`` on each of the most instances the run may have), so a round of
    groups is never split by calls waiting for a thread, and weight pulls never queue behind them."""
    from services.generation.instances import rpc_workers

    gen, so = run_cfg.generation, run_cfg.scaleout
    return rpc_workers(gen.max_inflight * (so.max_instances if so.enabled else gen.instances))


def load_estimator(ranker_dir: str):
    """``generation.ranker_dir`` (a ranker store) -> its watcher: ``get()`` returns the current
    ranker, reloaded when the store's CURRENT changes (hot swap, no restart)."""
    from ranker.store import RankerWatcher

    return RankerWatcher(ranker_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="braid-router", description="SGS router over N engine instances (gRPC)")
    parser.add_argument("--config", required=True, help="resolved run config (config.json)")
    parser.add_argument("--model", required=True, help="the checkpoint the instances serve (config, tokenizer)")
    parser.add_argument("--instances", required=True, help="instance addresses host:port[,host:port...]")
    add_serve_args(parser)
    parser.add_argument("--timeline", help="append per-instance timeline events (JSONL) here")
    add_tls_args(parser)
    ns = parser.parse_args(argv)
    tls = tls_from_args(parser, ns)
    setup_logging("router")

    from services.common.affinity import pin_cpus
    from services.common.config import load_config

    run_cfg = load_config(ns.config)
    cfg = run_cfg.generation
    pin_cpus(cfg.cpus, "SGS router")  # a generation-site process

    from services.generation.client import GenerationClient
    from services.generation.router import RouterCore
    from services.generation.router_server import RouterServicer
    from services.generation.scheduling import NEEDS_COST
    from services.generation.server import create_server

    model_config = json.loads((Path(ns.model) / "config.json").read_text())
    clients = [GenerationClient(a, max_message_mb=cfg.max_message_mb) for a in ns.instances.split(",") if a]
    for client in clients:
        client.wait_ready(timeout_s=180)
    spec = load_spec(cfg, ns.model) if cfg.dispatch.policy in NEEDS_COST else None
    watcher = load_estimator(cfg.ranker_dir) if cfg.ranker_dir else None
    decode = None
    if watcher is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(ns.model, local_files_only=True)
        decode = lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True)  # noqa: E731
    core = RouterCore(
        clients, cfg, spec=spec, estimator=watcher.get if watcher else None, decode=decode, timeline_path=ns.timeline,
        estimator_name=(lambda: watcher.name) if watcher else None,
    )
    servicer = RouterServicer(
        core, cfg, vocab_size=int(model_config["vocab_size"]),
        max_positions=int(model_config["max_position_embeddings"]),
        keep_weights=run_cfg.scaleout.enabled, drain_timeout_s=run_cfg.scaleout.drain_timeout_s,
    )
    server, port = create_server(
        servicer, f"{ns.host}:{ns.port}", max_message_mb=cfg.max_message_mb, workers=router_workers(run_cfg), tls=tls
    )
    server.start()
    publish_port(ns.port_file, port)
    logging.info("routing on %s:%d over %d instances, policy %s%s", ns.host, port, len(clients), cfg.dispatch.policy,
                 ", mutual TLS" if tls else "")

    serve_until_signal(0.5)
    server.stop(grace=2).wait()
    core.close()
    for client in core.clients:  # including instances added at run time
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
