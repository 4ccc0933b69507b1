"""Offline held-out evaluation of saved policy checkpoints (the accuracy-over-time curves of ``bench/e2e.py``).

Braid's trainer (``trainer.checkpoint_every``) and the TRL peer (``bench/trl_peer.py``) both save
checkpoints as ``<run_dir>/checkpoints/vNNNNN/`` (HF ``save_pretrained`` + tokenizer; with
``trainer.lora`` a peft adapter, scored folded into its base: the index's ``base``) and append
``{"version", "path", "time"}`` lines to ``<run_dir>/checkpoints/index.jsonl``. This module scores
every checkpoint of a run the same way, outside the timed region of the run:

- prompts: the first ``n`` held-out problems ``eval_problems(cfg.eval.seed, n, **dist)`` (the set
  the training stream excludes; ``n <= cfg.eval.prompts``);
- decoding: plain batched HF ``generate``, **sampling at temperature 1.0** (no top-k / top-p: the
  distribution the policy is trained and rolled out with), one sample per prompt, a fixed torch
  seed reset before every checkpoint so all checkpoints and all modes see the same random stream;
- score: ``services.tasks.arith.reward`` on ``Policy.decode`` of the completion; accuracy is the
  mean and its standard error the binomial ``sqrt(p (1 - p) / n)``.

``prompt_scores`` is the paired variant ``bench/e2e_stats.py`` uses for convergence parity: per
prompt, the mean reward of k sampled completions, the seed reset per chunk of prompts.

    python bench/eval_checkpoints.py --run-dir runs/bench-e2e/sync --prompts 500
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

EVAL_SEED = 20240607  # torch seed of the sampling stream, reset per checkpoint
EVAL_BATCH = 256  # prompts per generate call (the tiny model fits any batch; bounds padding waste)
DECODING = "sampling, temperature 1.0, no top-k/top-p, one sample per prompt, torch seed reset per checkpoint"


@dataclass(frozen=True)
class EvalPoint:
    """Held-out accuracy of one checkpoint."""

    version: int
    time: float  # wall-clock time the checkpoint was written (epoch seconds); 0 for the warm start
    accuracy: float
    stderr: float
    prompts: int
    response_len_mean: float
    eval_seconds: float

    def to_json(self) -> dict:
        return asdict(self)


def binomial_stderr(accuracy: float, n: int) -> float:
    return math.sqrt(accuracy * (1.0 - accuracy) / n) if n > 0 else float("nan")


def read_index(run_dir: Path) -> list[dict]:
    """The checkpoint index of a run, ordered by version (empty when the run saved none)."""
    index = run_dir / "checkpoints" / "index.jsonl"
    if not index.is_file():
        return []
    rows = [json.loads(line) for line in index.read_text().splitlines() if line.strip()]
    return sorted(rows, key=lambda r: r["version"])


def held_out(config_path: Path, n: int):
    """The first ``n`` held-out problems of the run's config, and the generation cap."""
    from services.common.config import load_config
    from services.tasks.arith import eval_problems

    cfg = load_config(config_path)
    if n > cfg.eval.prompts:
        raise ValueError(f"--prompts ({n}) exceeds eval.prompts ({cfg.eval.prompts}) that training excluded")
    return eval_problems(cfg.eval.seed, n, **cfg.task.distribution()), cfg.generation.max_new_tokens


def _sampler(path: str | Path, max_new_tokens: int, base: str | None = None):
    """The checkpoint's policy (an adapter folded into ``base``, or the base it names) and the
    evaluation's decoding (sampling at temperature 1.0)."""
    from transformers import GenerationConfig

    from services.policy.model import load_checkpoint

    policy = load_checkpoint(path, base)
    policy.model.eval()
    gen = GenerationConfig(
        do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens,
        eos_token_id=policy.eos_id, pad_token_id=policy.pad_id,
    )
    return policy, gen


def _sample(policy, gen, rows) -> tuple[list[float], list[int]]:
    """One sampled completion per problem in ``rows`` (one left-padded batch): rewards and lengths."""
    import torch

    from services.tasks.arith import reward

    pad = policy.pad_id
    prompts = [policy.encode_prompt(p.prompt) for p in rows]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])  # left padding
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = policy.model.generate(input_ids=ids, attention_mask=mask, generation_config=gen)
    rewards, lengths = [], []
    for problem, row in zip(rows, out[:, width:].tolist(), strict=True):
        if policy.eos_id in row:
            row = row[: row.index(policy.eos_id) + 1]
        lengths.append(len(row))
        rewards.append(reward(problem, policy.decode(row)))
    return rewards, lengths


def evaluate_checkpoint(path: str | Path, problems, max_new_tokens: int, *, seed: int = EVAL_SEED,
                        version: int = 0, when: float = 0.0, base: str | None = None) -> EvalPoint:
    """Score one checkpoint on ``problems`` (one sampled completion each; a LoRA adapter folded
    into ``base``, default the base it names)."""
    import torch

    t0 = time.time()
    policy, gen = _sampler(path, max_new_tokens, base)
    torch.manual_seed(seed)
    rewards: list[float] = []
    lengths: list[int] = []
    for start in range(0, len(problems), EVAL_BATCH):
        r, n = _sample(policy, gen, problems[start:start + EVAL_BATCH])
        rewards += r
        lengths += n
    acc = sum(rewards) / len(rewards)
    return EvalPoint(version, when, acc, binomial_stderr(acc, len(rewards)), len(rewards),
                     sum(lengths) / len(lengths), time.time() - t0)


def prompt_scores(path: str | Path, problems, max_new_tokens: int, *, samples: int,
                  seed: int = EVAL_SEED) -> list[float]:
    """Per prompt, the mean reward of ``samples`` sampled completions: the paired evaluation of
    ``bench/e2e_stats.py``. Each chunk of prompts (its ``samples`` copies side by side in one batch)
    resets the torch seed to ``seed + chunk``, so every checkpoint scored this way draws the same
    random stream on the same prompts (common random numbers), whatever earlier chunks generated."""
    import torch

    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    policy, gen = _sampler(path, max_new_tokens)
    per_chunk = max(1, EVAL_BATCH // samples)
    scores: list[float] = []
    for c, start in enumerate(range(0, len(problems), per_chunk)):
        chunk = problems[start:start + per_chunk]
        torch.manual_seed(seed + c)
        rewards, _ = _sample(policy, gen, [p for p in chunk for _ in range(samples)])
        scores += [sum(rewards[i * samples:(i + 1) * samples]) / samples for i in range(len(chunk))]
    return scores


def evaluate_run(run_dir: Path, problems, max_new_tokens: int, *, seed: int = EVAL_SEED) -> list[EvalPoint]:
    """Score every checkpoint listed in the run's index (version order)."""
    return [
        evaluate_checkpoint(row["path"], problems, max_new_tokens, seed=seed, version=row["version"], when=row["time"],
                            base=row.get("base"))
        for row in read_index(run_dir)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True, help="run directory with config.json and checkpoints/index.jsonl")
    parser.add_argument("--prompts", type=int, default=None, help="held-out prompts (default: eval.prompts)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--out", default=None, help="JSON output (default: <run-dir>/eval_checkpoints.json)")
    ns = parser.parse_args(argv)

    import torch

    from services.common.config import load_config

    torch.set_num_threads(ns.threads)
    run_dir = Path(ns.run_dir)
    n = ns.prompts or load_config(run_dir / "config.json").eval.prompts
    problems, max_new = held_out(run_dir / "config.json", n)
    points = evaluate_run(run_dir, problems, max_new)
    out = Path(ns.out) if ns.out else run_dir / "eval_checkpoints.json"
    out.write_text(json.dumps({"decoding": DECODING, "seed": EVAL_SEED, "points": [p.to_json() for p in points]},
                              indent=2) + "\n")
    for p in points:
        print(f"v{p.version:05d}: accuracy {p.accuracy:.3f} ± {p.stderr:.3f} ({p.eval_seconds:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
