"""``braid eval``: score a checkpoint on a config's held-out set, as a run's own evaluation does.

``braid eval --model DIR --config C [--set KEY=VALUE ...] [--prompts N]`` starts what a run's
evaluation talks to, from the run's own starters (``flows.processes``, ``flows.reward_pool``): the
SGS instances the config names (``generation.engine``, ``generation.instances``, the router when
the config routes) serving ``DIR``, the reward workers, and for an agentic run the environment
workers; then this process plays the trainer's part with the trainer's own code
(``services.run.heldout.HeldOut.evaluate``): every held-out prompt once at the config's sampling
settings, each sample scored by the reward service, accuracy with its binomial standard error and
the breakdown by difficulty or by the dataset's group field, printed as JSON. Then every evaluation
suite of the config (``eval.suites``, ``services.run.suites``) the same way, at its own temperature:
``suites`` in the JSON holds each one's accuracy and standard error, the held-out set first, and a line
per suite goes to stderr; each suite's answers go to ``--out``'s ``evals/``. A run's ``final/`` holds
``final.json``; its accuracies are printed beside (``run``).

Every evaluation request carries ``eval.seed``; the SGS samples each held-out prompt from a
generator of its own seeded from it and the prompt's id (``services.run.heldout``): scoring a run's
``final/`` reproduces the run's final evaluation sample for sample, and scoring its warm start
(``runs/<id>/warmstart.path``) the run's warm-start evaluation, whatever the engine generated before.

Thin: argparse here; the services are imported inside the command. A missing directory, one that
is not a checkpoint, or a bad config exits 2 with one line; a service that fails exits 1 with its
log's tail. Processes' logs, the resolved config and ``eval.json`` go to ``--out`` (default
``<cache_dir>/eval/<time>-<pid>``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HELDOUT = "heldout"  # services.common.eval_config.HELDOUT (not imported: ``--help`` stays instant)


class EvalError(ValueError):
    """Bad input to ``braid eval`` (the message says which and why): exit 2."""


# The checkpoint is served as it is (a run's final/ has any LoRA adapter folded in): no adapter slot.
SERVE_AS_IS = "trainer.lora=null"


def eval_overrides(model: str | None, prompts: int | None, sets: list[str] | None) -> list[str]:
    """The config overrides of a ``braid eval``: the user's ``--set`` first, then ``--model`` as
    ``model.path`` and ``--prompts`` as ``eval.prompts``."""
    overrides = list(sets or [])
    if model:
        overrides.append(f"model.path={model}")
    if prompts is not None:
        overrides.append(f"eval.prompts={prompts}")
    return overrides


def one_line(message: str) -> str:
    """A multi-line message (the config's, one line per offending field) on one line."""
    out = ""
    for line in (x.strip() for x in message.splitlines()):
        if line:
            out += ("" if not out else " " if out.endswith(":") else "; ") + line
    return out


def check_checkpoint(path: Path):
    """``path``'s facts (``services.generation.checkpoint.inspect_checkpoint``) once it is a
    Hugging Face checkpoint with a tokenizer; ``EvalError`` saying what it is not."""
    from services.common.lora import ADAPTER_CONFIG
    from services.generation.checkpoint import CheckpointError, inspect_checkpoint

    if not path.exists():
        raise EvalError(f"--model {path}: no such directory")
    if not path.is_dir():
        raise EvalError(f"--model {path}: not a directory (a Hugging Face checkpoint directory is expected)")
    if (path / ADAPTER_CONFIG).is_file() and not (path / "config.json").is_file():
        raise EvalError(f"--model {path} is a LoRA adapter, not a checkpoint: pass the run's final/ (the adapter "
                        f"folded into its base), or fold it in first with `braid model merge`")
    try:
        info = inspect_checkpoint(path)
    except CheckpointError as err:
        raise EvalError(f"--model: {err}") from None
    if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        raise EvalError(f"--model {path} has no tokenizer (tokenizer.json or tokenizer_config.json)")
    return info


def resolve(ns: argparse.Namespace):
    """(the config with the overrides, the checkpoint directory, its tokenizer side as a ``Policy``);
    ``EvalError`` or the config's ``ConfigError`` for bad input."""
    from flows.registries import check_run, is_emulated
    from services.common.config import load_config
    from services.run.heldout import tokenizer_policy

    if not Path(ns.config).is_file():
        raise EvalError(f"--config {ns.config}: no such file")
    cfg = check_run(load_config(ns.config, [*eval_overrides(ns.model, ns.prompts, ns.set), SERVE_AS_IS]))
    if is_emulated(cfg):
        raise EvalError(f"{ns.config} is an EMULATED run (generation.engine emulated): its tokens are synthetic and "
                        "its reward a declared rate, so there is nothing to score; evaluate a real run's final/")
    model = cfg.model.path
    if not model:
        raise EvalError(f"{ns.config} builds the tiny model from scratch (model.path is unset): pass --model DIR "
                        "(a run's final/, or its warm start: the directory in runs/<id>/warmstart.path)")
    if model.endswith(".gguf") or model.startswith("package:"):
        from services.policy.importer import ModelImportError, resolve_model

        try:  # a GGUF model: imported once into the cache, as a run does
            model = str(resolve_model(model, cfg.cache_dir))
        except ModelImportError as err:
            raise EvalError(f"model.path {model}: {err}") from None
    path = Path(model).resolve()
    check_checkpoint(path)
    try:
        policy = tokenizer_policy(path, cfg.model.chat_template)
    except (OSError, ValueError) as err:  # a tokenizer that does not load, or does not fit the config
        raise EvalError(f"--model {path}: {err}") from None
    return cfg, path, policy


def eval_report(result, *, model: Path, config: str, overrides: list[str], cfg, fingerprint: str,
                meta: dict | None, seconds: float, out: Path) -> dict:
    """The JSON ``braid eval`` prints (pure): the score, what was scored on what, and the run's own
    final accuracy when ``model`` is a run's ``final/`` (``meta``: its ``final.json``)."""
    by = "steps" if cfg.task.kind != "dataset" else (cfg.task.dataset.group_field or "none")
    report = {
        "accuracy": result.accuracy,
        "stderr": result.stderr,
        "prompts": result.prompts,
        "model": str(model),
        "config": str(Path(config).resolve()),
        "overrides": overrides,
        "engine": cfg.generation.engine,
        "temperature": cfg.generation.temperature,
        "eval_seed": cfg.eval.seed,
        "eval_fingerprint": fingerprint,
        "response_len_mean": result.response_len_mean,
        "reward_failures": result.reward_failures,
        "breakdown_by": "difficulty" if cfg.agentic.enabled else by,
        "breakdown": result.by_difficulty,
        "seconds": round(seconds, 1),
        "out": str(out),
    }
    if meta is not None:
        same = meta.get("eval_fingerprint") == fingerprint
        diff = result.accuracy - meta["accuracy"]
        report["run"] = {"accuracy": meta["accuracy"], "stderr": meta["stderr"], "eval_prompts": meta["eval_prompts"],
                         "weight_version": meta["weight_version"], "same_heldout_set": same,
                         "difference_in_stderr": diff / max(meta["stderr"], result.stderr, 1e-9) if same else None}
    return report


def suites_report(results: dict, cfg, fingerprints: dict[str, str], meta: dict | None) -> dict[str, dict]:
    """Every suite's score (the held-out split first) as ``braid eval`` prints it (pure); beside each, the
    run's own final score of that suite (``run``) when ``model`` is a run's ``final/`` (``meta``: its
    ``final.json``) that scored the same prompts."""
    temperatures = {HELDOUT: cfg.generation.temperature}
    temperatures |= {s.name: cfg.generation.temperature if s.temperature is None else s.temperature
                     for s in cfg.eval.suites}
    out = {}
    for name, r in results.items():
        row = {"accuracy": r.accuracy, "stderr": r.stderr, "prompts": r.prompts, "temperature": temperatures[name],
               "fingerprint": fingerprints[name], "breakdown": r.by_difficulty, "reward_failures": r.reward_failures}
        ran = ((meta or {}).get("suites") or {}).get(name)
        if ran is not None and ran.get("fingerprint") == fingerprints[name]:
            row["run"] = {"accuracy": ran["accuracy"], "stderr": ran["stderr"], "prompts": ran["prompts"]}
        out[name] = row
    return out


def _progress_bar(total: int, suite: str):
    """A bar on stderr over a suite's samples received (``HeldOut.evaluate_suite``'s ``progress``)."""
    from tqdm import tqdm

    from services.common.progress import progress_interval

    bar = tqdm(total=total, desc=f"{suite} samples", unit="sample", mininterval=progress_interval(), file=sys.stderr)

    def update(n: int) -> None:
        bar.update(n - bar.n)

    return bar, update


def _serve_and_score(cfg, model: Path, policy, out: Path) -> tuple[dict, dict, float]:
    """Start the SGS, reward (and environment) workers for ``cfg`` serving ``model``; score every
    suite, the held-out set first; stop them. Returns (suite name -> ``EvalResult``, suite name ->
    its prompts' fingerprint, seconds)."""
    from flows.processes import (
        Supervisor,
        instances_per_process,
        router_enabled,
        start_env_workers,
        start_instances,
        start_router,
    )
    from flows.reward_pool import RewardPoolController
    from services.generation.client import GenerationClient
    from services.run.heldout import HeldOut, build_agentic, single_turn_rewards
    from services.run.suites import ANSWERS_DIR

    sup = Supervisor(out)
    pool = RewardPoolController(sup, out, cfg)
    closing: list = []
    t0 = time.time()
    try:
        launched = pool.launch()  # their start-up overlaps the SGS's
        addresses = start_instances(sup, out, str(model), cfg.generation.instances, cfg.generation.threads,
                                    per_process=instances_per_process(cfg.generation))
        if router_enabled(cfg):
            addresses = [start_router(sup, out, str(model), addresses)]
        envs = start_env_workers(sup, out, cfg.agentic.workers) if cfg.agentic.enabled else []
        pool.start(launched)
        clients = [GenerationClient(a, max_message_mb=cfg.generation.max_message_mb) for a in addresses]
        closing += clients
        for client in clients:
            client.wait_ready(timeout_s=120)
        rewards = None if cfg.agentic.enabled else single_turn_rewards(cfg, str(pool.membership), out)
        closing += [rewards] if rewards is not None else []
        held = HeldOut(cfg, policy, clients, rewards)
        held.answers_dir = out / ANSWERS_DIR
        if cfg.agentic.enabled:
            # the turns pick on the HeldOut's table (real capacity), as training's and single-turn evaluation do
            held.rollout = build_agentic(cfg, policy, clients, envs, str(pool.membership), held.fleet)
            closing.append(held.rollout)
            print(f"braid eval: playing {held.eval_size} held-out episodes", file=sys.stderr)
            return {HELDOUT: held.evaluate("eval-checkpoint")}, {HELDOUT: held.eval_fingerprint()}, time.time() - t0
        results = {}
        for suite in held.suites:  # the held-out split first, then eval.suites
            bar, update = _progress_bar(len(suite.items), suite.name)
            t1 = time.time()
            try:
                results[suite.name] = held.evaluate_suite(suite, f"eval-checkpoint-{suite.name}", progress=update)
            finally:
                bar.close()
            print(f"braid eval: {suite.name} scored in {time.time() - t1:.1f} s", file=sys.stderr)
        fingerprints = {s.name: s.fingerprint for s in held.suites} | {HELDOUT: held.eval_fingerprint()}
        return results, fingerprints, time.time() - t0
    finally:
        for thing in reversed(closing):
            thing.close()
        pool.close()
        sup.stop_all()


def _eval(ns: argparse.Namespace) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from flows.processes import ServiceDied
    from services.common.config import ConfigError, write_config
    from services.run.final import read_meta

    try:
        cfg, model, policy = resolve(ns)
    except (EvalError, ConfigError, FileNotFoundError) as err:
        print(f"braid eval: {one_line(str(err))}", file=sys.stderr)
        return 2
    out = Path(ns.out or Path(cfg.cache_dir, "eval", f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    write_config(cfg, out / "config.json")
    try:
        results, fingerprints, seconds = _serve_and_score(cfg, model, policy, out)
    except (ServiceDied, TimeoutError, RuntimeError) as err:  # a service that did not start or failed
        print(f"braid eval: {err}\n(logs: {out})", file=sys.stderr)
        return 1
    meta = read_meta(model)
    report = eval_report(results[HELDOUT], model=model, config=ns.config,
                         overrides=eval_overrides(None, ns.prompts, ns.set), cfg=cfg, fingerprint=fingerprints[HELDOUT],
                         meta=meta, seconds=seconds, out=out)
    report["suites"] = suites_report(results, cfg, fingerprints, meta)
    (out / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    for name, s in report["suites"].items():
        print(f"braid eval: {name}: {s['accuracy']:.3f} ± {s['stderr']:.3f} ({s['prompts']} prompts)", file=sys.stderr)
    print(json.dumps(report, indent=2))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``braid eval`` on the top-level subparsers (argparse only)."""
    p = sub.add_parser(
        "eval", help="score a checkpoint (a run's final/, a base model) on a config's held-out set and suites; "
        "print JSON",
        description="Score a Hugging Face checkpoint on the held-out set of a run config, with the config's engine, "
        "sampling settings and reward, by the code a run's own evaluation runs: the SGS and reward workers start, "
        "every held-out prompt is answered once and scored, and accuracy with its standard error (and the breakdown "
        "by difficulty or the dataset's group field) is printed as JSON, then every evaluation suite of the config "
        "(eval.suites) at its own temperature. `braid eval --model runs/<id>/final "
        "--config runs/<id>/config.json` scores a run's trained model.",
    )
    p.add_argument("--model", help="checkpoint directory (default: the config's model.path)")
    p.add_argument("--config", required=True, help="run config (YAML, or a run's resolved config.json)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="config override, e.g. generation.instances=1")
    p.add_argument("--prompts", type=int, help="held-out prompts to score (eval.prompts; default: the config's)")
    p.add_argument("--out", help="directory for the services' logs and eval.json (default: <cache_dir>/eval/...)")
    p.set_defaults(func=_eval)
