"""The measurements of ``bench/real_model.py`` on one checkpoint: held-out answers, log-prob agreement, ranker.

- ``generate_heldout``: an SGS process (the product's vLLM engine, the run's generation settings)
  serving the checkpoint answers every held-out question ``samples`` times at the training
  temperature; each answer is scored by the run's own reward terms (``services.reward.dataset``,
  the code the reward workers run), its length kept, its tokens and the engine's log-probs kept.
- ``logprob_agreement``: the trainer's log-probs of the same tokens (``services.policy.batch.
  token_logprobs`` at the generation temperature, float32, what the learner computes) against the
  engine's sampled-token log-probs: |difference| per token (mean, p99, max) and the per-sequence
  log importance ratio (sum of the differences: its spread, and the share of sequences whose
  ratio leaves [0.8, 1.25]).
- ``ranker_recall``: a LightGBM ranker trained on the run's own generation log (every sample the
  SGS finished during training, lengths in tokens) scored on the held-out questions against their
  mean output length under the trained policy (recall@20%, Spearman), beside the prompt-length
  baseline.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np

P99 = 0.99
RATIO_BAND = (0.8, 1.25)  # a sequence whose trainer/engine probability ratio leaves this is "off"


@dataclass
class Answer:
    prompt_id: str
    family: str
    correct: bool
    length: int
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]


def heldout_items(cfg, limit: int | None = None) -> list:
    """The rows of the held-out file (ids e0.. in file order; the first ``limit`` when given)."""
    from dataclasses import replace

    from services.tasks.dataset import read_rows

    rows = read_rows(cfg.task.dataset.heldout, cfg.task.dataset)[:limit]
    return [replace(r, prompt_id=f"e{i}") for i, r in enumerate(rows)]


def generate_heldout(cfg, config_path: Path, model_dir: Path, work: Path, samples: int, tag: str,
                     limit: int | None = None) -> list[Answer]:
    """Answers of ``model_dir`` to the held-out questions (see the module docstring)."""
    from flows.processes import Supervisor, start_instances
    from services.common.types import GenerateParams, PromptSpec
    from services.generation.client import GenerationClient
    from services.policy.model import load_policy
    from services.reward.dataset import DatasetReward
    from services.tasks.source import reward_request

    items = heldout_items(cfg, limit)
    policy = load_policy(model_dir, cfg.model.chat_template)
    reward = DatasetReward(cfg.reward, (cfg.task.dataset.name,))
    specs = [PromptSpec(i.prompt_id, tuple(policy.encode_prompt(i.prompt, i.system)), task=i.task) for i in items]
    by_id = {i.prompt_id: i for i in items}
    work.mkdir(parents=True, exist_ok=True)
    sup = Supervisor(work)
    answers = []
    try:
        (address,) = start_instances(sup, work, str(model_dir), 1, os.cpu_count() or 1, config=config_path)
        client = GenerationClient(address, max_message_mb=cfg.generation.max_message_mb)
        client.wait_ready(timeout_s=300)
        for s in client.generate(specs, GenerateParams(samples_per_prompt=samples, tag=tag)):
            item = by_id[s.prompt_id]
            text = policy.decode(list(s.token_ids))
            scored = reward.score(reward_request(item, text, f"{s.prompt_id}/{s.sample_index}"))
            answers.append(Answer(s.prompt_id, json.loads(item.row_json).get("family", ""),
                                  scored.info["correct"] == "true", len(s.token_ids), list(s.prompt_token_ids),
                                  list(s.token_ids), list(s.logprobs)))
        client.close()
    finally:
        sup.stop_all()
    return answers


def per_prompt_accuracy(answers: list[Answer]) -> dict[str, float]:
    by: dict[str, list[bool]] = {}
    for a in answers:
        by.setdefault(a.prompt_id, []).append(a.correct)
    return {k: sum(v) / len(v) for k, v in by.items()}


def paired_gain(before: list[Answer], after: list[Answer]) -> dict:
    """Held-out accuracy before and after, and the paired difference per question with its standard error."""
    a, b = per_prompt_accuracy(before), per_prompt_accuracy(after)
    if set(a) != set(b):
        raise ValueError("before and after answered different questions")
    diffs = [b[k] - a[k] for k in sorted(a)]
    se = statistics.stdev(diffs) / math.sqrt(len(diffs))
    gain = statistics.fmean(diffs)
    return {"heldout_before": statistics.fmean(a.values()), "heldout_after": statistics.fmean(b.values()),
            "gain": gain, "gain_stderr": se, "gain_se": gain / se if se > 0 else float("inf"), "questions": len(diffs)}


def by_family(answers: list[Answer]) -> dict[str, dict[str, float]]:
    out: dict[str, list[bool]] = {}
    for a in answers:
        out.setdefault(a.family, []).append(a.correct)
    return {f: {"n": len(v), "accuracy": sum(v) / len(v)} for f, v in sorted(out.items())}


def length_stats(answers: list[Answer]) -> dict[str, float]:
    lengths = np.array([a.length for a in answers], dtype=np.float64)
    return {"length_p50": float(np.percentile(lengths, 50)), "length_p90": float(np.percentile(lengths, 90)),
            "length_p99": float(np.percentile(lengths, 99)), "length_max": float(lengths.max()),
            "length_mean": float(lengths.mean())}


def logprob_agreement(cfg, model_dir: Path, answers: list[Answer], n: int, seed: int = 0) -> dict:
    """The trainer's log-probs against the engine's on ``n`` answers drawn by ``seed``."""
    import random

    import torch

    from services.policy.batch import pack, token_logprobs
    from services.policy.model import load_policy

    torch.set_num_threads(max(1, cfg.trainer.threads))
    policy = load_policy(model_dir, cfg.model.chat_template)
    chosen = random.Random(seed).sample(answers, min(n, len(answers)))
    diffs: list[float] = []
    log_ratios: list[float] = []
    with torch.no_grad():
        for start in range(0, len(chosen), 8):
            part = chosen[start:start + 8]
            batch = pack([a.prompt_ids for a in part], [a.token_ids for a in part], policy.pad_id)
            logp = token_logprobs(policy.model, batch, cfg.generation.temperature)
            for b, a in enumerate(part):
                plen = len(a.prompt_ids)
                mine = logp[b, plen - 1: plen - 1 + len(a.token_ids)].tolist()
                d = [m - e for m, e in zip(mine, a.logprobs, strict=True)]
                diffs += [abs(x) for x in d]
                log_ratios.append(sum(d))
    arr, lr = np.array(diffs), np.array(log_ratios)
    lo, hi = (math.log(x) for x in RATIO_BAND)
    return {"sequences": len(chosen), "tokens": len(diffs),
            "logprob_abs_diff_mean": float(arr.mean()), "logprob_abs_diff_p99": float(np.quantile(arr, P99)),
            "logprob_abs_diff_max": float(arr.max()),
            "seq_log_ratio_std": float(lr.std()), "seq_log_ratio_abs_p99": float(np.quantile(np.abs(lr), P99)),
            "seq_ratio_outside_band": float(np.mean((lr < lo) | (lr > hi))), "ratio_band": list(RATIO_BAND)}


def ranker_recall(genlog: Path, tokenizer, answers: list[Answer]) -> dict:
    """A LightGBM ranker trained on the run's generation log, scored on the held-out questions."""
    from ranker.data import Dataset, examples_from_log
    from ranker.metrics import evaluate
    from ranker.train import train

    examples = examples_from_log(genlog, 10**7)
    data = Dataset(tuple(examples), str(genlog))
    lengths: dict[str, list[int]] = {}
    prompts: dict[str, str] = {}
    for a in answers:
        lengths.setdefault(a.prompt_id, []).append(a.length)
        prompts[a.prompt_id] = tokenizer.decode(a.prompt_ids, skip_special_tokens=True)  # as the SGS logs prompts
    ids = sorted(prompts)
    texts = [prompts[k] for k in ids]
    truth = np.array([statistics.fmean(lengths[k]) for k in ids])
    out = {"train_examples": len(examples), "heldout_prompts": len(ids)}
    for kind in ("lightgbm", "prompt_length"):
        model = train(data, None, kind=kind, unit="tokens")
        out[kind] = evaluate(model.predict(texts), truth)
    return out


def write_answers(path: Path, answers: list[Answer]) -> None:
    path.write_text("".join(json.dumps({"prompt_id": a.prompt_id, "family": a.family, "correct": a.correct,
                                        "length": a.length}) + "\n" for a in answers))
