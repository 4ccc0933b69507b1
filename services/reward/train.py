"""``braid reward train``: train the model reward on calculator transcripts generated offline.

Data: for each seed, the calculator problem of that episode (``agentic.calculator``'s
distribution) is played by an agent that follows the expert (``calculator.demonstration``:
subtract the step through the tool while the value is above the threshold, then answer) with
one of these changes, drawn at random:

==================  ======  ==============================================================
change              weight  what the agent does
==================  ======  ==============================================================
none                0.40    the expert's turns
invalid turn        0.10    one turn of text that does not parse (observation ``=,``), then the expert
wrong final answer  0.20    the expert's calls, then an answer off by 1..9
wrong operand       0.15    one call subtracts another step, then the expert from the value seen
early answer        0.15    answers the current value before it reaches the threshold
==================  ======  ==============================================================

The agent steps a real environment, so every transcript is consistent, and the label is the
rule kind's reward (1: correct). Held-out transcripts are other episodes (other seeds) of the
same distribution. The count-down problem space is small (a few thousand problems with the
default distribution), so many held-out transcripts also occur in training; the evaluation
reports accuracy against the majority-class baseline on all held-out transcripts and,
separately, on the ``unseen`` ones whose rendering never occurs in training, and per change.
Training: AdamW with linear warm-up and cosine decay, cross-entropy, fixed-size batches drawn
with replacement.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from services.agentic.calculator import CalculatorEnv, demonstration
from services.common.agentic_config import AgenticConfig
from services.reward.model import ClassifierSpec, batch, build_classifier, encode, probabilities, save_classifier
from services.reward.protocol import RewardRequest
from services.reward.rule import RuleReward

CHANGES = ("none", "invalid", "wrong_answer", "wrong_operand", "early_answer")
CHANGE_WEIGHTS = (0.40, 0.10, 0.20, 0.15, 0.15)
EVAL_SEED_BASE = 1_000_000_000  # held-out episodes use seeds from here (training seeds are below)
INVALID_TEXTS = ("", "x", "9-", "#", "12-3-4", ">5", "-")


@dataclass(frozen=True)
class TrainSpec:
    """The training run (`braid reward train` sets steps, examples and seed)."""

    steps: int = 1500
    batch_size: int = 32
    lr: float = 3e-3  # 1e-2 got stuck on the default distribution (never learned wrong answers)
    warmup_steps: int = 20
    train_examples: int = 3000  # transcripts generated for training
    eval_examples: int = 1000  # held-out transcripts (other seeds)
    seed: int = 0
    threads: int = 1  # torch threads while training (more oversubscribe a shared CPU: 10x slower measured here)
    model: ClassifierSpec = field(default_factory=ClassifierSpec)


DEFAULT_SPEC = TrainSpec()


def agent_actions(env: CalculatorEnv, change: str, rng: random.Random) -> list[str]:
    """The turns of the expert with ``change`` applied (``env`` was reset; it is stepped here)."""
    p = env.problem
    assert p is not None
    expert = demonstration(p)
    if change == "none":
        return expert
    if change == "invalid":
        k = rng.randrange(len(expert))
        return [*expert[:k], rng.choice(INVALID_TEXTS), *expert[k:]]
    if change == "wrong_answer":
        answer = int(expert[-1][1:])
        wrong = answer + rng.choice([-1, 1]) * rng.randint(1, 9)
        return [*expert[:-1], f"#{wrong if wrong >= 0 else answer + 1}"]
    if change == "early_answer":  # after k < q calls the value n - k d is still above the threshold
        k = rng.randrange(p.difficulty)
        return [*expert[:k], f"#{p.n - k * p.d}"]
    # wrong operand: one call subtracts another step, then the expert continues from the value seen
    wrong_turn = rng.randrange(len(expert) - 1) if len(expert) > 1 else 0
    x, turns = p.n, []
    while x > p.m:
        d = p.d if len(turns) != wrong_turn else rng.choice([s for s in range(1, 10) if s != p.d])
        turns.append(f"{x}-{d}")
        x -= d
    return [*turns, f"#{x}"]


def play(agentic: AgenticConfig, seed: int, change: str, rng: random.Random) -> RewardRequest:
    """One consistent calculator transcript: the agent's actions and the environment's observations."""
    env = CalculatorEnv.from_config(agentic)
    prompt = env.reset(seed).text
    actions, observations = [], []
    for action in agent_actions(env, change, rng):
        result = env.step(CalculatorEnv.parse_action(action))
        actions.append(action)
        observations.append(result.observation.text)
        if result.done:
            break
    return RewardRequest(f"s{seed}-{change}", "calculator", seed, prompt, tuple(actions), tuple(observations))


def transcripts(agentic: AgenticConfig, seeds: range, rng: random.Random) -> list[tuple[RewardRequest, int]]:
    """Labelled transcripts (label 1: the rule reward is 1), one per seed."""
    rule = RuleReward(agentic)
    out = []
    for seed in seeds:
        request = play(agentic, seed, rng.choices(CHANGES, weights=CHANGE_WEIGHTS)[0], rng)
        out.append((request, int(rule.score(request).reward >= 1.0)))
    return out


def train(agentic: AgenticConfig, out: str | Path, spec: TrainSpec = DEFAULT_SPEC) -> dict:
    """Generate data, train, evaluate on held-out transcripts, save to ``out``; return the metrics."""
    t0 = time.monotonic()
    threads = torch.get_num_threads()
    torch.set_num_threads(spec.threads)
    try:
        model, tok, metrics = _train(agentic, spec)
    finally:
        torch.set_num_threads(threads)
    metrics["train_s"] = time.monotonic() - t0
    save_classifier(model, tok, out, {"tasks": ["calculator"], "max_tokens": spec.model.max_tokens,
                                      "train": asdict(spec), "agentic_calculator": agentic.calculator.model_dump(),
                                      "metrics": metrics})
    return metrics


def _train(agentic: AgenticConfig, spec: TrainSpec) -> tuple[PreTrainedModel, PreTrainedTokenizerFast, dict]:
    rng = random.Random(spec.seed)
    base = spec.seed * spec.train_examples
    train_set = transcripts(agentic, range(base, base + spec.train_examples), rng)
    model, tok = build_classifier(spec.model)
    encoded = [(encode(tok, r, spec.model.max_tokens), y) for r, y in train_set]
    held = transcripts(agentic, range(EVAL_SEED_BASE + base, EVAL_SEED_BASE + base + spec.eval_examples), rng)
    losses = _fit(model, int(tok.pad_token_id), encoded, spec)
    metrics = evaluate(model, tok, held, {tuple(ids) for ids, _ in encoded}, spec.model.max_tokens)
    metrics.update(train_examples=len(encoded), train_correct=sum(y for _, y in encoded) / len(encoded),
                   final_loss=sum(losses[-20:]) / len(losses[-20:]))
    return model, tok, metrics


def _fit(model: PreTrainedModel, pad_id: int, data: list[tuple[list[int], int]], spec: TrainSpec) -> list[float]:
    torch.manual_seed(spec.seed)
    gen = random.Random(spec.seed + 1)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.01)

    def lr_at(step: int) -> float:
        if step < spec.warmup_steps:
            return (step + 1) / spec.warmup_steps
        progress = (step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * progress))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    model.train()
    losses = []
    for _ in range(spec.steps):
        rows = gen.choices(data, k=spec.batch_size)
        ids, mask = batch([r for r, _ in rows], pad_id)
        labels = torch.tensor([y for _, y in rows], dtype=torch.long)
        loss = torch.nn.functional.cross_entropy(model(input_ids=ids, attention_mask=mask).logits, labels)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    model.eval()
    return losses


def evaluate(model: PreTrainedModel, tok: PreTrainedTokenizerFast, held: list[tuple[RewardRequest, int]],
             seen: set[tuple[int, ...]], max_tokens: int, batch_size: int = 256) -> dict:
    """Accuracy (P(correct) >= 0.5) on the held-out transcripts against the majority-class baseline,
    also on those whose rendering never occurs in training (``unseen``) and per change."""
    rows = [encode(tok, r, max_tokens) for r, _ in held]
    predicted = []
    for i in range(0, len(rows), batch_size):
        predicted += [int(p >= 0.5) for p in probabilities(model, tok, rows[i:i + batch_size])]
    hits = [p == y for p, (_, y) in zip(predicted, held, strict=True)]
    unseen = [k for k, ids in enumerate(rows) if tuple(ids) not in seen]
    by_change: dict[str, list[bool]] = {}
    for (r, _), hit in zip(held, hits, strict=True):
        by_change.setdefault(r.request_id.rsplit("-", 1)[1], []).append(hit)
    return {**_accuracy("held_out", hits, [y for _, y in held]),
            **_accuracy("unseen", [hits[k] for k in unseen], [held[k][1] for k in unseen]),
            "by_change": {c: sum(v) / len(v) for c, v in sorted(by_change.items())}}


def _accuracy(name: str, hits: list[bool], labels: list[int]) -> dict:
    positive = sum(labels) / len(labels) if labels else 0.0
    return {name: len(labels), f"{name}_accuracy": sum(hits) / len(hits) if hits else None,
            f"{name}_majority_baseline": max(positive, 1 - positive) if labels else None}
