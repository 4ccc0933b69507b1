"""The TRL peer of ``bench/trl_fair.py``: ``bench/trl_peer.py`` unchanged, plus TRL's own per-step
logs in ``<run-dir>/trl_logs.jsonl`` (one line per optimizer step: ``step`` and what ``GRPOTrainer.log``
logged, among it ``completions/mean_length``, the completion tokens per sample including the
stop token, the same count as Braid's ``response_len_mean``), so TRL gets tokens/s.

Runs inside the benchmark-only TRL virtualenv, with ``bench/trl_peer.py``'s arguments:

    <trl-venv>/bin/python bench/trl_fair_peer.py --config RUN/config.json --model CKPT --run-dir RUN ...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

LOGS = "trl_logs.jsonl"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--run-dir", required=True)
    run_dir = Path(parser.parse_known_args(argv)[0].run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOGS
    path.unlink(missing_ok=True)

    import transformers
    import trl_peer

    original = transformers.Trainer.log

    def log(self, logs: dict, *args, **kwargs):  # GRPOTrainer.log adds its metrics, then calls this
        if "completions/mean_length" in logs:
            with path.open("a") as f:
                f.write(json.dumps({"step": self.state.global_step, **logs}, default=str) + "\n")
        return original(self, logs, *args, **kwargs)

    transformers.Trainer.log = log
    return trl_peer.main(argv)


if __name__ == "__main__":
    sys.exit(main())
