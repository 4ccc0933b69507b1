"""Supervised warm start: a short SFT pass on task demonstrations, cached by content hash.

RL needs a policy that sometimes succeeds. The warm start trains next-token prediction on the
reference scratchpads (loss on completion tokens only) — on a dataset task, its rows' reference
answers; with ``agentic.enabled``, the environment expert's multi-turn episodes (loss on the
action tokens only) — with AdamW and cosine decay, then saves
an HF checkpoint under ``<cache_dir>/warmstart-<hash>/``. The hash covers everything that
determines the result (model source and config, task distribution or dataset files, SFT settings,
held-out set), so a second run with the same settings loads the checkpoint instead of training;
with ``warmstart.steps: 0`` it is the base model as it is (a pretrained checkpoint), keyed by the
model alone.
Held-out evaluation prompts are excluded from the demonstrations.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from services.common.config import RunConfig, WarmstartConfig
from services.common.progress import progress_interval
from services.policy.batch import length_buckets, pack, token_logprobs
from services.policy.model import Policy, build_policy, load_policy, save_policy
from services.policy.warmcache import cache_key, cached_warmstart, task_identity, warmstart_dir  # noqa: F401
from services.policy.warmcheck import AccuracyCheck, Check
from services.tasks.arith import ProblemSampler, demonstration, eval_problems

Demos = tuple[list[list[int]], list[list[int]], list[tuple[int, ...]] | None]  # prompts, completions, loss masks


class ArithDemos:
    """The count-down task's reference scratchpads (single turn; every completion token trained)."""

    def __init__(self, cfg: RunConfig, policy: Policy) -> None:
        held_out = frozenset(p.prompt
                             for p in eval_problems(cfg.eval.seed, cfg.eval.prompts, **cfg.task.distribution()))
        self.sampler = ProblemSampler(cfg.warmstart.seed, exclude=held_out, **cfg.task.distribution())  # type: ignore[arg-type]
        self.policy = policy

    def batch(self, n: int) -> Demos:
        problems, policy = self.sampler.batch(n), self.policy
        prompts = [policy.encode_prompt(p.prompt) for p in problems]
        comps = [[*policy.tokenizer.encode(demonstration(p), add_special_tokens=False), policy.eos_id]
                 for p in problems]
        return prompts, comps, None


class DatasetDemos:
    """A dataset's rows as demonstrations: the prompt, then the reference answer text as the completion
    (e.g. GSM8K's worked solutions); held-out rows are excluded."""

    def __init__(self, cfg: RunConfig, policy: Policy) -> None:
        from services.tasks.dataset import DatasetSampler, load_dataset

        assert cfg.task.dataset is not None
        train, _ = load_dataset(cfg.task.dataset, cfg.eval.prompts, cfg.eval.seed)
        self.sampler = DatasetSampler(train, cfg.warmstart.seed)
        self.policy = policy

    def batch(self, n: int) -> Demos:
        items, policy = self.sampler.batch(n), self.policy
        prompts = [policy.encode_prompt(i.prompt, i.system) for i in items]
        comps = [[*policy.tokenizer.encode(i.answer, add_special_tokens=False), policy.eos_id] for i in items]
        return prompts, comps, None


class AgenticDemos:
    """Multi-turn expert episodes of ``agentic.env`` laid out as rollouts are (``services.agentic.training``):
    the loss covers the expert's action tokens only, held-out evaluation episodes are excluded."""

    def __init__(self, cfg: RunConfig, policy: Policy) -> None:
        from services.agentic.episodes import EpisodeStream, eval_episodes
        from services.agentic.registry import ENVIRONMENTS

        a = cfg.agentic
        self.env = ENVIRONMENTS[a.env].from_config(a)
        self.stream = EpisodeStream(a, cfg.warmstart.seed, eval_episodes(a, cfg.eval.seed, cfg.eval.prompts),
                                    tag="warmstart")
        self.policy, self.max_turns = policy, a.max_turns

    def batch(self, n: int) -> Demos:
        from services.agentic.training import demonstration as episode

        demos = [episode(self.env, e.seed, self.policy, self.max_turns) for e in self.stream.take(n)]
        return [d.prompt_ids for d in demos], [d.completion_ids for d in demos], [d.loss_mask for d in demos]


def base_policy(cfg: RunConfig) -> Policy:
    """The model the warm start begins from: ``model.path`` (a checkpoint directory, or a GGUF file
    imported once into the cache: ``services.policy.importer``), else the built tiny model."""
    if not cfg.model.path:
        return build_policy(cfg.model)
    from services.policy.importer import resolve_model

    return load_policy(resolve_model(cfg.model.path, cfg.cache_dir), cfg.model.chat_template)


@dataclass
class SftResult:
    """What the SFT pass did: the loss per step, and with ``warmstart.target_accuracy`` its checks."""

    losses: list[float] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)

    @property
    def reached(self) -> bool | None:
        """Whether a check reached the target (None: no target)."""
        return self.checks[-1].reached if self.checks else None


def sft(policy: Policy, cfg: RunConfig, *, progress: bool = True) -> SftResult:
    """Train ``policy`` in place on demonstrations, for ``warmstart.steps`` steps or, with
    ``warmstart.target_accuracy``, until a check reaches it (``services.policy.warmcheck``)."""
    ws = cfg.warmstart
    kinds = {"arith": ArithDemos, "dataset": DatasetDemos}
    source = AgenticDemos(cfg, policy) if cfg.agentic.enabled else kinds[cfg.task.kind](cfg, policy)
    with ExitStack() as stack:
        check = stack.enter_context(AccuracyCheck(cfg, policy)) if ws.target_accuracy is not None else None
        # A bar advanced by hand: iterating a tqdm bar updates its count only when it redraws (every
        # mininterval, 20 s in a log), so a postfix refresh in between showed 0/steps beside a moving loss.
        bar = stack.enter_context(tqdm(total=ws.steps, desc="warm start (SFT)", disable=not progress, unit="step",
                                       mininterval=progress_interval()))
        result = _train(policy, ws, source, check, bar)
    policy.model.eval()
    return result


def _train(policy: Policy, ws: WarmstartConfig, source: ArithDemos | DatasetDemos | AgenticDemos,
           check: AccuracyCheck | None, bar: tqdm) -> SftResult:
    """The SFT loop: AdamW on the lr schedule over ``ws.steps``; stops early at a check that reaches
    the target (the schedule stays the one over ``ws.steps``: where it stops depends on the CPU)."""
    policy.model.train()
    opt = torch.optim.AdamW(policy.model.parameters(), lr=ws.lr, weight_decay=0.0, betas=(0.9, 0.98))
    result = SftResult()
    for step in range(ws.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(ws, step)
        result.losses.append(_sft_step(policy, opt, source.batch(ws.batch_size), ws.micro_batch_tokens))
        bar.update(1)
        shown = {"loss": f"{result.losses[-1]:.3f}"}
        due = check is not None and (step + 1 == next_check(result.checks, ws) or step + 1 == ws.steps)
        if due:
            result.checks.append(check(policy, step + 1))
            shown["acc"] = f"{result.checks[-1].accuracy:.3f}"
        bar.set_postfix(shown, refresh=False)  # drawn with the count at the next redraw
        if due and result.checks[-1].reached:
            break
    return result


def next_check(checks: list[Check], ws: WarmstartConfig) -> int:
    """The SFT step of the next accuracy check: ``check_every`` steps after the last one, or four
    times as far while the last stood below half the target (an SFT far from it, whose checks
    would cost as much as its steps)."""
    assert ws.target_accuracy is not None
    last = checks[-1] if checks else None
    if last is None:
        return ws.check_every
    far = last.accuracy < ws.target_accuracy / 2
    return last.step + ws.check_every * (4 if far else 1)


def lr_at(ws: WarmstartConfig, step: int) -> float:
    """Linear warm-up over the first 5% of ``ws.steps``, then cosine decay to 10% at ``ws.steps``."""
    warmup = max(1, ws.steps // 20)
    if step < warmup:
        return ws.lr * (step + 1) / warmup
    frac = (step - warmup) / max(1, ws.steps - warmup)
    return ws.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def _sft_step(policy: Policy, opt: torch.optim.Optimizer, demos: Demos, micro_batch_tokens: int) -> float:
    """One optimizer step on ``demos`` (micro-batches of at most ``micro_batch_tokens`` padded
    tokens, the loss normalised by the batch's loss tokens); returns the step's loss."""
    prompts, comps, masks = demos
    n_tokens = sum(sum(m) for m in masks) if masks is not None else sum(len(c) for c in comps)
    opt.zero_grad(set_to_none=True)
    total = 0.0
    lengths = [len(p) + len(c) for p, c in zip(prompts, comps, strict=True)]
    for idx in length_buckets(lengths, micro_batch_tokens):
        batch = pack([prompts[i] for i in idx], [comps[i] for i in idx], policy.pad_id,
                     [masks[i] for i in idx] if masks is not None else None)
        loss = -(token_logprobs(policy.model, batch) * batch.completion_mask).sum() / n_tokens
        loss.backward()
        total += loss.item()
    torch.nn.utils.clip_grad_norm_(policy.model.parameters(), 1.0)
    opt.step()
    return total


def ensure_warmstart(cfg: RunConfig, *, progress: bool = True) -> Path:
    """Return the warm-start checkpoint dir, training it first if it is not cached."""
    out = warmstart_dir(cfg)
    if cached_warmstart(cfg) is not None:
        return out
    torch.set_num_threads(max(1, torch.get_num_threads()))
    policy = base_policy(cfg)
    t0 = time.time()
    done = sft(policy, cfg, progress=progress) if cfg.warmstart.steps > 0 else SftResult()
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_policy(policy, tmp)
    meta = {"steps": len(done.losses), "max_steps": cfg.warmstart.steps, "seconds": time.time() - t0,
            "final_loss": done.losses[-1] if done.losses else None,
            "target_accuracy": cfg.warmstart.target_accuracy, "target_reached": done.reached,
            "checks": [asdict(c) for c in done.checks]}
    (tmp / "warmstart.json").write_text(json.dumps(meta, indent=2) + "\n")
    if done.reached is False:
        print(f"warning: the warm start reached accuracy {done.checks[-1].accuracy:.3f} in {len(done.losses)} "
              f"steps, short of warmstart.target_accuracy {cfg.warmstart.target_accuracy}: RL starts from it "
              "(raise warmstart.steps or warmstart.lr to reach the target)", file=sys.stderr)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m services.policy.warmstart --config run/config.json --out FILE``: ensure the
    checkpoint exists and write its path to FILE."""
    import argparse

    from services.common.config import load_config

    parser = argparse.ArgumentParser(prog="braid-warmstart", description=main.__doc__)
    parser.add_argument("--config", required=True)
    parser.add_argument("--out", required=True, help="file that receives the checkpoint path")
    ns = parser.parse_args(argv)
    path = ensure_warmstart(load_config(ns.config))
    Path(ns.out).write_text(str(path.resolve()) + "\n")
    print(f"warm-start checkpoint: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
