"""``braid``: the command line. Thin: parse arguments, then import what the command needs."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from flows.reward_cli import positive_int  # argparse only; torch loads lazily


def prefect_env(cache_dir: str) -> None:
    """Local Prefect defaults (ephemeral API) unless the user configured a server."""
    home = Path(os.environ.setdefault("PREFECT_HOME", str(Path(cache_dir, "prefect").resolve())))
    home.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def config_overrides(ns: argparse.Namespace) -> list[str]:
    """The ``--set`` overrides, then ``--model`` as ``model.path`` (``braid run`` and ``braid config``)."""
    overrides = list(ns.set or [])
    if ns.model:
        overrides.append(f"model.path={ns.model}")
    return overrides


def _run(ns: argparse.Namespace) -> int:
    from flows.registries import check_run
    from services.common.config import ConfigError, load_config

    overrides = config_overrides(ns)
    if ns.run_id:
        overrides.append(f"run_id={ns.run_id}")
    plan = ns.plan
    try:
        cfg = check_run(load_config(ns.config, overrides))  # fail fast, before Prefect starts
        if ns.cluster:
            plan = _cluster_plan(ns, cfg)
    except (ConfigError, FileNotFoundError) as err:
        print(err, file=sys.stderr)
        return 2
    from services.common.cpu import cpu_info

    print(cpu_info().line(), flush=True)  # a run's time, and its warm start's numerics, depend on it
    prefect_env(cfg.cache_dir)
    from flows.rl_training import rl_training

    result = rl_training(config_path=ns.config, overrides=overrides, plan=plan)
    print(run_output(result))
    return 0


def _cluster_plan(ns: argparse.Namespace, cfg) -> dict:
    """``--cluster``: the allocator's plan for this EMULATED run, printed as ``braid allocate`` does."""
    from allocator.allocate import format_table
    from flows.emulated_plan import plan_for_run
    from services.common.config import ConfigError

    if ns.plan:
        raise ConfigError("--cluster plans the run itself: give --cluster or --plan, not both")
    plan = plan_for_run(cfg, ns.cluster, ns.workload, ns.objective)
    print(format_table(plan), flush=True)
    return plan


RUN_KEYS = ("run_dir", "mode", "warmstart_accuracy", "final_accuracy", "accuracy_stderr", "eval_prompts",
            "samples_per_second", "final_checkpoint")


def run_output(result: dict) -> str:
    """What ``braid run`` prints: the result's headline as JSON, then how to score the trained
    model, and last the line that says where it is."""
    shown = {k: result[k] for k in RUN_KEYS}
    if result.get("cpu"):
        shown["cpu"] = result["cpu"]
    adapter = result.get("final_adapter")
    if adapter:
        shown["final_adapter"] = adapter
    final = result["final_checkpoint"]
    config = Path(result["run_dir"], "config.json").resolve()
    return "\n".join([
        json.dumps(shown, indent=2),
        f"score it: braid eval --model {final} --config {config}",
        f"final model: {final}" + (f" (LoRA adapter folded in; the adapter: {adapter})" if adapter else ""),
    ])


def _config(ns: argparse.Namespace) -> int:
    from flows.registries import check_run
    from services.common.config import ConfigError, load_config

    try:
        cfg = check_run(load_config(ns.config, config_overrides(ns)))
    except (ConfigError, FileNotFoundError) as err:
        print(err, file=sys.stderr)
        return 2
    print(json.dumps(cfg.model_dump(mode="json"), indent=2))
    return 0


def _profile(ns: argparse.Namespace) -> int:
    """Measure a PTL profile on the engine, or write a roofline-derived one (``--derive``)."""
    from services.generation.scheduling.profiles import ProfileError

    if ns.derive:
        from services.generation.scheduling.profiles import derive_profile, save_profile

        hardware, _, model = ns.derive.partition(":")
        try:
            profile = derive_profile(hardware, model)
        except ValueError as err:
            print(err, file=sys.stderr)
            return 2
        print(json.dumps({"out": str(save_profile(profile, ns.out)), "tensor_parallel": profile.tensor_parallel,
                          "kv_capacity_tokens": profile.kv_capacity_tokens}, indent=2))
        return 0
    from services.common.config import ConfigError

    try:
        from allocator.profiler import run_profile

        result = run_profile(ns.config, ns.model, ns.out, hardware=ns.hardware, quick=ns.quick, repeats=ns.repeats)
    except (ConfigError, ProfileError, FileNotFoundError) as err:
        print(err, file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0


def _profile_train(ns: argparse.Namespace) -> int:
    """Measure a training step-time profile on the trainer's learner (``allocator.train_profiler``)."""
    from services.common.config import ConfigError
    from services.generation.scheduling.profiles import ProfileError

    try:
        from allocator.train_profiler import run_train_profile

        result = run_train_profile(ns.config, ns.model, ns.out, hardware=ns.hardware, quick=ns.quick,
                                   threads=ns.threads, device=ns.device, sigma=ns.sigma, overrides=list(ns.set or []))
    except (ConfigError, ProfileError, FileNotFoundError, ValueError) as err:
        print(f"braid profile-train: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="braid", description="Asynchronous, disaggregated RL post-training")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the rl_training flow (local Prefect, local services)")
    run.add_argument("--config", default="deploy/configs/default.yaml", help="YAML config file")
    run.add_argument("--set", action="append", metavar="KEY=VALUE", help="override, e.g. trainer.mode=sync")
    run.add_argument("--model", help="local HF checkpoint dir instead of the built tiny model")
    run.add_argument("--run-id", help="run directory name under runs/")
    run.add_argument("--plan",
                     help="allocation plan JSON (`braid allocate --json`): an EMULATED run runs the planned fleet; "
                     "braid-tiny plans set the SGS instances")
    run.add_argument("--cluster", help="EMULATED runs: plan this cluster file (deploy/clusters/*.yaml) with the "
                     "allocator and run the plan")
    run.add_argument("--workload", help="with --cluster: the workload file to plan for (default: the run's own "
                     "iteration: its batch and emulated output lengths)")
    run.add_argument("--objective", choices=("time", "cost"), default="time", help="with --cluster: the planner's "
                     "objective")
    run.set_defaults(func=_run)

    cfg = sub.add_parser("config", help="print the resolved config (validates it)")
    cfg.add_argument("--config", default="deploy/configs/default.yaml")
    cfg.add_argument("--set", action="append", metavar="KEY=VALUE", help="override, e.g. trainer.mode=sync")
    cfg.add_argument("--model", help="local HF checkpoint dir instead of the built tiny model (as braid run)")
    cfg.set_defaults(func=_config)

    prof = sub.add_parser("profile",
                          help="measure PTL(batch size) and KV bytes/token on the engine; write a profile JSON")
    prof.add_argument("--config", default="deploy/configs/default.yaml",
                      help="config whose model and generation settings are profiled")
    prof.add_argument("--model", help="local HF checkpoint dir (default: the config's built tiny model)")
    prof.add_argument("--out", required=True, help="profile JSON to write")
    prof.add_argument("--hardware", default="cpu-local", help="hardware kind recorded in the profile")
    prof.add_argument("--quick", action="store_true", help="fewer batch sizes")
    prof.add_argument("--repeats", type=positive_int, default=1,
                      help="measure each point this many times (passes interleaved) and keep the median")
    prof.add_argument("--derive", metavar="GPU:MODEL",
                      help="write a roofline-derived profile instead, e.g. H20:qwen2.5-7b")
    prof.set_defaults(func=_profile)

    ptrain = sub.add_parser("profile-train",
                            help="measure training step time vs tokens on the trainer's learner; write a profile JSON")
    ptrain.add_argument("--config", default="deploy/configs/default.yaml",
                        help="config whose model and trainer settings are profiled")
    ptrain.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="config override, e.g. trainer.kl_coef=0.01")
    ptrain.add_argument("--model", help="local HF checkpoint dir (default: the config's model)")
    ptrain.add_argument("--out", help="profile JSON to write (default: allocator/profiles/"
                        "HARDWARE-MODEL[-BACKEND][-DTYPE]-train.json, torch and float32 left out)")
    ptrain.add_argument("--hardware", help="hardware kind recorded in the profile (default: cpu-local on a CPU, "
                        "the GPU kind in the CUDA device's name)")
    ptrain.add_argument("--quick", action="store_true", help="a 2 x 2 grid of equal lengths, 3 repeats")
    ptrain.add_argument("--threads", type=int, help="torch threads (default: the config's trainer.threads)")
    ptrain.add_argument("--device", help="trainer.device to measure on: cpu, cuda, cuda:1 (default: the config's)")
    ptrain.add_argument("--sigma", type=float,
                        help="log-space spread of the grid's spread points (default 0.9, the count-down task's; "
                        "0: equal lengths only; --quick: 0)")
    ptrain.set_defaults(func=_profile_train)

    router = sub.add_parser("router", help="run the SGS router over N instances", add_help=False)
    router.set_defaults(func=lambda ns: _delegate("services.generation.router_main", ns.rest))
    router.add_argument("rest", nargs=argparse.REMAINDER)

    sgs = sub.add_parser("sgs", help="run a Stream Generation Service process", add_help=False)
    sgs.set_defaults(func=lambda ns: _delegate("services.generation.__main__", ns.rest))
    trainer = sub.add_parser("trainer", help="run a trainer process", add_help=False)
    trainer.set_defaults(func=lambda ns: _delegate("services.run.__main__", ns.rest))
    relay = sub.add_parser("relay", help="run a weight relay process (parameter service)", add_help=False)
    relay.set_defaults(func=lambda ns: _delegate("services.weights.__main__", ns.rest))
    certs = sub.add_parser("certs", help="make a local CA and per-site TLS certificates (--sites FILE)", add_help=False)
    certs.set_defaults(func=lambda ns: _delegate("services.common.certs", ns.rest))
    for p in (sgs, trainer, relay, certs):
        p.add_argument("rest", nargs=argparse.REMAINDER)
    server = sub.add_parser("server", help="local Prefect server + work pools + deployments + workers (docs/deploy.md)")
    server.add_argument("action", choices=["start", "stop", "status"],
                        help="`braid server start --help` lists the options")
    server.add_argument("rest", nargs=argparse.REMAINDER)
    server.set_defaults(func=lambda ns: _delegate("flows.server", [ns.action, *ns.rest]))

    from flows.ranker_cli import add_parser as add_ranker_parser  # argparse only; models load lazily

    add_ranker_parser(sub)
    from flows.allocate_cli import add_parser as add_allocate_parser  # argparse only; the planner loads lazily

    add_allocate_parser(sub)
    from flows.affinity_cli import add_parser as add_affinity_parser  # argparse only; the planner loads lazily

    add_affinity_parser(sub)
    from flows.reward_cli import add_parser as add_reward_parser  # argparse only; torch loads lazily

    add_reward_parser(sub)
    from flows.model_cli import add_parser as add_model_parser  # argparse only; torch loads lazily

    add_model_parser(sub)
    from flows.follow_cli import add_parser as add_follow_parser  # argparse only; Prefect loads lazily

    add_follow_parser(sub)
    from flows.eval_cli import add_parser as add_eval_parser  # argparse only; the services load lazily

    add_eval_parser(sub)
    return parser


def _delegate(module: str, argv: list[str]) -> int:
    import importlib

    return importlib.import_module(module).main(argv)


_DELEGATED = {
    "sgs": "services.generation.__main__", "trainer": "services.run.__main__",
    "relay": "services.weights.__main__", "certs": "services.common.certs",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in _DELEGATED:  # argparse's REMAINDER drops a leading --option: hand over as is
        return _delegate(_DELEGATED[argv[0]], argv[1:])
    ns = build_parser().parse_args(argv)
    return ns.func(ns)


if __name__ == "__main__":
    sys.exit(main())
