"""``braid ranker ...``: convert data, train, evaluate and annotate with the output-length ranker.

Thin: arguments are parsed here; ``ranker`` modules (numpy, LightGBM, torch) are imported only
inside the command that runs. Errors in data files or ranker directories print one line naming
the file, line and field, and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys

KINDS = ("lightgbm", "transformer", "ensemble", "prompt_length", "tfidf_linear")


def _params(text: str | None) -> dict:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise SystemExit(f"--params: not valid JSON ({err.msg})") from None
    if not isinstance(value, dict):
        raise SystemExit("--params: expected a JSON object of model parameters")
    return value


def _convert_mmlu(ns: argparse.Namespace) -> int:
    from ranker.data import convert_mmlu
    from ranker.train import write_unit

    counts = convert_mmlu(ns.src, ns.out, model=ns.model, seed=ns.seed)
    for name in counts:
        write_unit(f"{ns.out}/{name}.jsonl", "characters")
    print(json.dumps({"out": ns.out, "model": ns.model, "unit": "characters", **counts}))
    return 0


def _convert_log(ns: argparse.Namespace) -> int:
    from ranker.data import convert_log
    from ranker.train import write_unit

    n = convert_log(ns.log, ns.out, n=ns.n)
    write_unit(ns.out, "tokens")
    print(json.dumps({"out": ns.out, "rows": n, "unit": "tokens"}))
    return 0


def _train(ns: argparse.Namespace) -> int:
    from ranker.train import train

    model = train(ns.data, ns.out, kind=ns.kind, params=_params(ns.params), unit=ns.unit)
    print(json.dumps({"out": ns.out, "kind": model.kind, "unit": model.unit, **model.train_info}))
    return 0


def _load(ranker: str):
    """The ranker of ``--ranker``: a saved ranker directory or a store's current version (said on stderr)."""
    from ranker.base import load_ranker
    from ranker.store import resolve_ranker_dir

    path, note = resolve_ranker_dir(ranker)
    if note:
        print(f"braid ranker: {note}", file=sys.stderr)
    return path, load_ranker(path)


def _eval(ns: argparse.Namespace) -> int:
    from ranker.train import evaluate_ranker, unit_mismatch

    path, model = _load(ns.ranker)
    result = {**evaluate_ranker(model, ns.data), "ranker": str(path)}
    warning = unit_mismatch(result)
    if warning:
        print(f"braid ranker eval: {warning}", file=sys.stderr)
    if ns.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>14}  {value}")
    return 0


def _annotate(ns: argparse.Namespace) -> int:
    from ranker.train import annotate

    n = annotate(_load(ns.ranker)[1], ns.prompts, ns.out, keep_prompt=not ns.drop_prompt)
    print(json.dumps({"out": ns.out, "rows": n}))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``braid ranker`` and its commands on the top-level subparsers."""
    top = sub.add_parser("ranker", help="output-length ranker: convert, train, eval, annotate")
    cmds = top.add_subparsers(dest="ranker_command", required=True)

    p = cmds.add_parser("convert-mmlu", help="MMLU-Pro CoT lengths -> train/val/test JSONL (characters)")
    p.add_argument("--src", default="../shared/data/mmlu-pro-cot/mmlu_pro_cot_lengths.jsonl.gz")
    p.add_argument("--out", required=True, help="output directory for train/val/test.jsonl")
    p.add_argument("--model", default="Meta-Llama-3_1-8B-Instruct", help="whose response lengths")
    p.add_argument("--seed", type=int, default=0, help="seed of the 7:2:1 split by prompt")
    p.set_defaults(func_ranker=_convert_mmlu)

    p = cmds.add_parser("convert-log", help="SGS generation log -> JSONL (tokens)")
    p.add_argument("--log", required=True, help="generation log (SQLite)")
    p.add_argument("--out", required=True, help="output JSONL")
    p.add_argument("--n", type=int, default=10_000, help="most recent N finished samples")
    p.set_defaults(func_ranker=_convert_log)

    p = cmds.add_parser("train", help="train a ranker on a JSONL file")
    p.add_argument("--data", required=True, help='JSONL: {"prompt", "response_length"[, "id"]} per line')
    p.add_argument("--out", required=True, help="output ranker directory")
    p.add_argument("--kind", default="lightgbm", choices=KINDS)
    p.add_argument("--unit", choices=("characters", "tokens", "unknown"),
                   help="unit of response_length (default: the <data>.unit file the converters write)")
    p.add_argument("--params", help='model parameters as JSON, e.g. \'{"epochs": 1}\'')
    p.set_defaults(func_ranker=_train)

    p = cmds.add_parser("eval", help="recall@20/10/5%% and Spearman of a ranker on a JSONL file")
    p.add_argument("--ranker", required=True, help="ranker directory, or a ranker store (its current version)")
    p.add_argument("--data", required=True, help="JSONL with true response lengths")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func_ranker=_eval)

    p = cmds.add_parser("annotate", help="add estimated_length to every prompt of a JSONL file")
    p.add_argument("--ranker", required=True, help="ranker directory, or a ranker store (its current version)")
    p.add_argument("--prompts", required=True, help='JSONL with a "prompt" per line (other fields kept)')
    p.add_argument("--out", required=True, help="output JSONL")
    p.add_argument("--drop-prompt", action="store_true", help="leave the prompt text out of the output")
    p.set_defaults(func_ranker=_annotate)
    top.set_defaults(func=_dispatch)


def _dispatch(ns: argparse.Namespace) -> int:
    from ranker.base import RankerFormatError
    from ranker.data import DataError
    from ranker.genlog import GenerationLogError

    try:
        return ns.func_ranker(ns)
    except (DataError, RankerFormatError, GenerationLogError, ValueError) as err:
        print(f"braid ranker {ns.ranker_command}: {err}", file=sys.stderr)
        return 2
