"""``python -m services.run``: the trainer process of one RL run.

Connects to the SGS, evaluates the warm start, runs the RL iterations in the configured
pipeline mode, evaluates again, writes the policy it ends with to ``final/`` (``services.run.final``)
and ``metrics.jsonl``, ``timeline.json`` and ``summary.json`` into the run directory. Exits
non-zero on any failure.

``--tls-dir DIR`` gives this site's certificate (``DIR/ca.pem``, ``DIR/<training-site>.pem``/
``.key``) for other sites' relays; with ``--sgs-tls`` it reaches the SGS (``--sgs``, an
instance or router serving ``--tls-dir/--tls-site``) over mutual TLS too.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import time
from pathlib import Path
from typing import NoReturn

from services.common.certs import TlsFiles, site_files
from services.common.cpu import cpu_info
from services.common.entry import exit_process


def tls_files(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> tuple[TlsFiles | None, TlsFiles | None]:
    """(for relays, for the SGS): this site's files from ``--tls-dir`` (None without it); the
    second only with ``--sgs-tls``, checked now (``parser.error`` naming missing files)."""
    tls = site_files(ns.tls_dir, ns.training_site) if ns.tls_dir else None
    if not ns.sgs_tls:
        return tls, None
    if tls is None:
        parser.error("--sgs-tls needs --tls-dir (this site's certificate reaches the SGS)")
    try:
        tls.read()
    except FileNotFoundError as err:
        parser.error(str(err))
    return tls, tls


def start_parallel(cfg):
    """This process's rank when ``trainer.ranks > 1`` (the process group is up), else None."""
    from services.trainer.device import resolve_device
    from services.trainer.parallel import context_from_env, init_process_group

    ctx = context_from_env()
    ranks = cfg.trainer.ranks
    if (ctx.world if ctx else 1) != ranks:
        raise SystemExit(f"trainer.ranks is {ranks} but WORLD_SIZE is {ctx.world if ctx else 'unset'}: start the "
                         f"ranks with `braid run` (the launcher) or torchrun --nproc-per-node {ranks}")
    if ctx is not None:
        init_process_group(ctx, resolve_device(cfg.trainer.device, ctx.local_rank))
    return ctx


def follow_leader(cfg, model: str, ctx) -> NoReturn:
    """Ranks 1..N-1: hold a shard of the policy and make rank 0's learner calls on their share."""
    import torch

    from services.policy.model import load_policy
    from services.trainer.learner import Learner
    from services.trainer.parallel import follow, shutdown

    torch.set_num_threads(cfg.trainer.threads)
    learner = Learner(cfg, load_policy(model, cfg.model.chat_template), ctx)
    served = follow(learner, ctx)
    logging.info("rank %d: served %d commands of the leader", ctx.rank, served)
    shutdown(0)


def start_learner(cfg, model: str, run_dir: Path):
    """The learner's own process (``trainer.learner``), forked now, before this process has a
    thread; each replacement of a dead one is logged to ``learner-restarts.jsonl``."""
    from dataclasses import asdict

    from services.run.learner_process import LearnerProcess

    def revived(revival) -> None:
        with (run_dir / "learner-restarts.jsonl").open("a") as f:
            f.write(json.dumps(asdict(revival)) + "\n")

    return LearnerProcess(cfg, model, run_dir, cfg.trainer.recovery.max_restarts, on_revive=revived)


def log_scores(when: str, results: dict) -> None:
    for name, r in results.items():
        logging.info("%s accuracy %.3f ± %.3f (%s, %d prompts)", when, r.accuracy, r.stderr, name, r.prompts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="braid-trainer", description="GRPO trainer process")
    parser.add_argument("--config", required=True, help="resolved run config (config.json)")
    parser.add_argument("--model", required=True, help="local checkpoint dir to start from")
    parser.add_argument("--sgs", required=True, help="SGS instance addresses host:port[,host:port...]")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument(
        "--relays", default="",
        help="weight relays host:port[@site[@tls://host:port]][,...] (relay transport; the first is the master)",
    )
    parser.add_argument("--training-site", default="local", help="this process's site (the master relay's)")
    parser.add_argument("--tls-dir", default="",
                        help="`braid certs` directory: reach other sites' relays with mutual TLS")
    parser.add_argument(
        "--sgs-tls", action="store_true", help="reach the SGS (--sgs) with mutual TLS too (needs --tls-dir)"
    )
    parser.add_argument("--env-workers", default="",
                        help="environment worker addresses host:port[,...] (agentic.enabled; the launcher starts them)")
    parser.add_argument("--reward-membership", required=True,
                        help="the reward pool's membership file (the launcher starts the workers; "
                        "every run scores there)")
    parser.add_argument("--attempt", type=int, default=0,
                        help="restart count (the launcher's): > 0 resumes from the run dir's newest recovery "
                        "checkpoint")
    parser.add_argument("--died-at", type=float, default=None,
                        help="unix time the launcher saw the previous attempt die (for the recovery time)")
    ns = parser.parse_args(argv)
    started_at = time.time()
    tls, sgs_tls = tls_files(parser, ns)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s trainer %(levelname)s %(message)s")

    from services.common.affinity import pin_cpus
    from services.common.config import load_config

    cfg = load_config(ns.config)
    pin_cpus(cfg.trainer.cpus, "trainer")  # before torch creates its threads
    parallel = start_parallel(cfg)
    if parallel is not None and not parallel.leader:
        return follow_leader(cfg, ns.model, parallel)

    run_dir = Path(ns.run_dir)
    learner = start_learner(cfg, ns.model, run_dir) if cfg.trainer.learner_in_process() else None

    from services.generation.client import GenerationClient
    from services.policy.model import load_policy
    from services.rollout.rewards import failures_logged
    from services.run.final import ADAPTER_DIR, write_final
    from services.run.heldout import build_agentic, single_turn_rewards
    from services.run.loop import RLTrainer
    from services.run.resume import recovery_summary

    clients = [
        GenerationClient(a, max_message_mb=cfg.generation.max_message_mb, tls=sgs_tls) for a in ns.sgs.split(",") if a
    ]
    for client in clients:
        client.wait_ready(timeout_s=120)
    from services.run.transport import create_transport

    relays = [a for a in ns.relays.split(",") if a]
    if cfg.weights.transport == "relay" and not relays:
        parser.error("weights.transport is 'relay': pass the relay addresses with --relays")
    transport = create_transport(
        cfg.weights.transport, cfg.weights, relays=relays, chunk_bytes=cfg.trainer.chunk_bytes,
        training_site=ns.training_site, tls=tls,
    )
    policy = load_policy(ns.model, cfg.model.chat_template)
    if cfg.trainer.backend == "emulated":  # EMULATED: waits out the allocator's predicted step times
        from services.trainer.emulated import EmulatedLearner

        learner = EmulatedLearner(cfg, policy, ns.model)
    rewards = None if cfg.agentic.enabled else single_turn_rewards(cfg, ns.reward_membership, run_dir)
    trainer = RLTrainer(cfg, policy, clients, run_dir, transport=transport, parallel=parallel, rewards=rewards,
                        learner=learner)
    trainer.model_dir = ns.model
    trainer.connect = lambda a: GenerationClient(a, max_message_mb=cfg.generation.max_message_mb, tls=sgs_tls)
    envs = [a for a in ns.env_workers.split(",") if a]
    if cfg.agentic.enabled and not envs:
        parser.error("agentic.enabled: pass the environment workers (--env-workers)")

    resumed = trainer.open_recovery(ns.attempt, ns.died_at, started_at)
    if cfg.agentic.enabled:  # after recovery: a restarted trainer's SGS clients shift versions on the wire
        trainer.rollout = build_agentic(cfg, policy, trainer.clients, envs, ns.reward_membership, trainer.fleet)

    def progress(k: int, row: dict) -> None:
        logging.info(
            "iter %d/%d reward %.3f len %.1f %.1f samples/s stale %.2f",
            k + 1, cfg.trainer.iterations, row["reward_mean"], row["response_len_mean"],
            row["samples_per_s"], row["staleness_mean"],
        )

    evaluations = trainer.evaluations
    suites_before = evaluations.warm_start(resumed)
    before = suites_before["heldout"]
    log_scores("warm start", suites_before)
    t0, first = time.time(), trainer.version
    trainer.run_iterations(progress)
    rl_seconds = time.time() - t0
    trainer.ledger.close()
    suites_after = evaluations.final()
    after = suites_after["heldout"]
    log_scores("final", suites_after)
    # before the learner ends: its weights are the final policy
    final = write_final(trainer, after, ns.config, suites_after)
    logging.info("final model: %s", final)
    trainer.write_timeline()
    trainer.publisher.close()
    if parallel is not None or learner is not None:
        trainer.learner.close()  # the learner process ends; data parallel: the followers stop following
    iterations = trainer.version  # cfg.trainer.iterations, unless eval.stop_on_forgetting ended the run early
    samples = (iterations - first) * cfg.trainer.prompts_per_iteration * cfg.trainer.group_size
    suites = evaluations.summary(suites_after, trainer.version)
    rl_seconds -= evaluations.seconds  # RL time: not the evaluations between steps
    cpu = cpu_info()
    summary = {
        "mode": cfg.trainer.mode,
        "iterations": iterations,
        "warmstart_accuracy": before.accuracy,
        "warmstart_stderr": before.stderr,
        "final_accuracy": after.accuracy,
        "accuracy_stderr": after.stderr,
        "improvement": after.accuracy - before.accuracy,
        "improvement_in_stderr": (after.accuracy - before.accuracy) / max(after.stderr, 1e-9),
        "eval_prompts": after.prompts,
        "eval_fingerprint": trainer.eval_fingerprint(),
        "samples_per_second": samples / rl_seconds,
        "trained_samples": samples,
        "rl_seconds": rl_seconds,
        "rl_started_at": t0,
        "final_weight_version": trainer.version,
        "eval_warmstart": before.to_json(),
        "eval_final": after.to_json(),
        "final_checkpoint": str(final),
        "final_adapter": str(final / ADAPTER_DIR) if cfg.trainer.lora is not None else None,
        "reward_failures": failures_logged(run_dir),  # every attempt's, evaluations included
        "breakdown": (cfg.task.dataset.group_field or "none") if cfg.task.kind == "dataset" else "steps",
        "cpu": cpu.line(),  # the trainer's CPU: times and CPU numerics depend on it (services/common/cpu.py)
        "cpu_info": cpu.to_json(),
        "trainer_max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # Linux: KiB
        **recovery_summary(run_dir, ns.attempt),
        **suites,
    }
    if cfg.trainer.backend == "emulated":  # its times are predictions: labelled, never mixed with measured ones
        scale = trainer.learner.time_scale
        summary["emulated"] = {**trainer.learner.summary(), "modelled_rl_seconds": rl_seconds / scale,
                               "modelled_samples_per_second": samples / rl_seconds * scale}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if trainer.rollout is not None:
        trainer.rollout.close()
    if rewards is not None:
        rewards.close()
    for client in clients:
        client.close()
    if parallel is not None:
        from services.trainer.parallel import shutdown

        shutdown(0)
    return 0


if __name__ == "__main__":
    exit_process(main())
