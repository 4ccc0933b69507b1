"""``braid reward ...``: the reward service's commands.

Thin: arguments are parsed here; torch and the reward model are imported only inside the command
that runs. ``train`` prints the measured held-out accuracy and the majority-class baseline as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys


def _train(ns: argparse.Namespace) -> int:
    from flows.registries import check_registries
    from services.common.config import ConfigError, load_config

    try:
        cfg = check_registries(load_config(ns.config, list(ns.set or [])))
    except (ConfigError, FileNotFoundError) as err:
        print(f"braid reward train: {err}", file=sys.stderr)
        return 2
    from services.reward.train import TrainSpec, train

    spec = TrainSpec(steps=ns.steps, train_examples=ns.examples, eval_examples=max(1, ns.examples // 3), seed=ns.seed)
    metrics = train(cfg.agentic, ns.out, spec)
    print(json.dumps({"out": ns.out, **metrics}, indent=2))
    return 0


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (its error names the value)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {value}")
    return value


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``braid reward`` and its commands on the top-level subparsers."""
    top = sub.add_parser("reward", help="reward service: train the model reward (workers: python -m services.reward)")
    cmds = top.add_subparsers(dest="reward_command", required=True)
    p = cmds.add_parser("train", help="train the model reward on calculator transcripts generated offline")
    p.add_argument("--config", default="deploy/configs/default.yaml",
                   help="run config (its agentic.calculator section)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="config override, e.g. agentic.calculator.max_steps=3")
    p.add_argument("--out", required=True, help="directory to write the classifier to (reward.model_path)")
    p.add_argument("--steps", type=positive_int, default=1500, help="optimizer steps")
    p.add_argument("--examples", type=positive_int, default=3000,
                   help="training transcripts (held out: a third as many)")
    p.add_argument("--seed", type=int, default=0, help="seed of the transcripts and the initial weights")
    p.set_defaults(func=_train)
