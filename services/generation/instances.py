"""One SGS process serving one instance, or many (``python -m services.generation --instances N``).

Each instance is what a process of its own would be: its engine, its ``GenerationCore`` (one
thread), its ``GenerationServicer`` and a gRPC server on a port of its own, its relay client and
its weight versions. The launcher, the router and the orchestrator cannot tell N instances of one
process from N processes. Only the emulated engine serves several per process (``vllm`` and ``hf``
hold a model each; ``__main__`` refuses them): N emulated instances start in seconds in one
interpreter, where N processes would each spend seconds of CPU importing torch.

Shared by the instances of one process:

- **the RPC thread pool**, sized as the sum of the pools the instances would have alone
  (``rpc_workers``: one thread per open call; a Python pool starts threads only as calls need
  them and reuses idle ones), so sharing never leaves a call waiting for a thread;
- the emulated engine's reads of the checkpoint, profile and length trace (cached in
  ``emulated_engine``);
- one generation-log writer (``genlog_writer``: each row keeps its instance).

Ports: instance ``first + k`` binds ``ports[k]`` (0: any free port); once every server serves,
the port file lists the bound ports one per line in instance order (one instance: one line, the
format every SGS process always wrote). A core that dies ends the process non-zero, as it ends a
process of one instance.
"""

from __future__ import annotations

import logging
from concurrent import futures
from dataclasses import dataclass

import grpc

from services.common.certs import TlsFiles
from services.common.config import RunConfig
from services.common.entry import serve_until_signal
from services.generation.core import GenerationCore
from services.generation.engine import Engine, create_engine
from services.generation.server import GenerationServicer, create_server

log = logging.getLogger("braid.sgs")


@dataclass
class Instance:
    index: int
    engine: Engine
    core: GenerationCore
    servicer: GenerationServicer
    server: grpc.Server
    port: int


def rpc_workers(max_inflight: int) -> int:
    """RPC threads one instance needs. One thread per open call (synchronous gRPC): a streaming
    Generate call holds its thread while it waits, so with fewer threads than open calls, control
    calls (PullWeights, Health) queue behind Generate calls that wait for the very weights
    PullWeights would bring: a deadlock seen in bounded mode with partial rollout (one call per
    resumed sample). Callers keep at most ``max_inflight`` samples, hence calls, per instance
    open; 16 threads more serve control calls."""
    return max_inflight + 16


def instance_ports(base: int, n: int) -> list[int]:
    """The ports of ``n`` instances from ``--port base``: ``base + k``, or 0 (any free port) for each."""
    return [base + k if base else 0 for k in range(n)]


def create_instance_engine(run_cfg: RunConfig, model: str, index: int) -> Engine:
    """The engine of instance ``index`` (its straggler delay: ``generation.step_delay_ms``)."""
    cfg = run_cfg.generation
    # trainer.lora set: the trainer pushes adapters only, and this instance serves base + adapter.
    return create_engine(cfg.engine, model, cfg, step_delay_s=cfg.delay_of(index) / 1000.0,
                         adapter=run_cfg.trainer.lora, weights_dtype=run_cfg.weights.dtype)


def build_instance(
    run_cfg: RunConfig, engine: Engine, index: int, address: str, *, relay: str = "", tls: TlsFiles | None = None,
    executor: futures.ThreadPoolExecutor | None = None, on_finished=None, labelled: bool = False,
) -> Instance:
    """Instance ``index`` over ``engine``: its core, servicer and a bound (unstarted) server at
    ``address``. ``labelled``: its thread and log lines name it (a process of several)."""
    cfg = run_cfg.generation
    core = GenerationCore(
        engine, max_inflight=cfg.max_inflight, default_max_new_tokens=cfg.max_new_tokens, admission=cfg.admission,
        on_finished=on_finished, instance=index if labelled else None,
    )
    relay_client = None
    if relay:
        from services.weights.client import RelayClient

        relay_client = RelayClient(relay, max_message_mb=run_cfg.weights.max_message_mb,
                                   data_path=run_cfg.weights.data_path)
    servicer = GenerationServicer(
        core, cfg, vocab_size=engine.vocab_size, max_positions=engine.max_positions, relay=relay_client,
        relay_streams=run_cfg.weights.streams, pull_wait_s=run_cfg.weights.pull_wait_s,
        delta=run_cfg.weights.delta,
    )
    server, port = create_server(servicer, address, max_message_mb=cfg.max_message_mb,
                                 workers=rpc_workers(cfg.max_inflight), tls=tls, executor=executor)
    return Instance(index, engine, core, servicer, server, port)


def serve(
    run_cfg: RunConfig, model: str, first: int, ports: list[int], *, host: str, relays: list[str],
    tls: TlsFiles | None, port_file: str | None,
) -> int:
    """Serve instances ``first .. first + len(ports) - 1`` until SIGTERM/SIGINT (then 0), or until a
    core or the generation log fails (then 1). Instance ``first + k`` pulls weights from
    ``relays[k % len(relays)]`` (none without relays)."""
    from services.common.atomic import write_text_atomic

    cfg = run_cfg.generation
    n = len(ports)
    executor = None
    if n > 1:
        executor = futures.ThreadPoolExecutor(max_workers=n * rpc_workers(cfg.max_inflight),
                                              thread_name_prefix="sgs-rpc")
    engines = [create_instance_engine(run_cfg, model, first + k) for k in range(n)]
    genlog = None
    if cfg.genlog:  # after the engines: its thread imports transformers, which must not race the engine's import
        from services.generation.genlog_writer import GenLogWriter

        genlog = GenLogWriter(cfg.genlog, model, first)
    instances = [
        build_instance(run_cfg, engine, first + k, f"{host}:{port}", relay=relays[k % len(relays)] if relays else "",
                       tls=tls, executor=executor, on_finished=genlog.recorder(first + k) if genlog else None,
                       labelled=n > 1)
        for k, (engine, port) in enumerate(zip(engines, ports, strict=True))
    ]
    for inst in instances:
        inst.core.start()
        inst.server.start()
        if inst.servicer.relay is not None and run_cfg.weights.sgs_auto_pull_s > 0:
            inst.servicer.start_auto_pull(run_cfg.weights.sgs_auto_pull_s)
    if port_file:  # written once every instance serves: its presence means all of them accept calls
        write_text_atomic(port_file, "\n".join(str(inst.port) for inst in instances))
    _log_serving(run_cfg, instances, host, tls)
    if (code := serve_until_signal(0.5, lambda: _failed(instances, genlog))) is not None:
        _stop_servers(instances, grace_s=1)
        return code
    _stop_servers(instances, grace_s=2)
    for inst in instances:
        inst.core.request_stop()
    for inst in instances:
        inst.core.join()
        inst.engine.close()
    if genlog is not None:
        genlog.close()
        genlog.check()
    return 0


def _log_serving(run_cfg: RunConfig, instances: list[Instance], host: str, tls: TlsFiles | None) -> None:
    engine = instances[0].engine.name
    extra = (f", LoRA adapter rank {run_cfg.trainer.lora.rank}" if run_cfg.trainer.lora else "") + \
        (", mutual TLS" if tls else "")
    if len(instances) == 1:
        log.info("serving on %s:%d (engine %s%s)", host, instances[0].port, engine, extra)
        return
    log.info("serving instances %d..%d on %s ports %s (engine %s%s)", instances[0].index, instances[-1].index,
             host, ",".join(str(inst.port) for inst in instances), engine, extra)


def _failed(instances: list[Instance], genlog) -> int | None:
    """The exit code when an instance's core or the generation log failed, else None."""
    for inst in instances:
        if not inst.core.alive():
            log.error("%sgeneration core died: %r", inst.core.label, inst.core.error)
            return 1
    if genlog is not None and genlog.error is not None:
        log.error("generation log failed: %r", genlog.error)
        return 1
    return None


def _stop_servers(instances: list[Instance], grace_s: float) -> None:
    """Stop every instance's server; their grace periods run at once."""
    for done in [inst.server.stop(grace=grace_s) for inst in instances]:
        done.wait()
