"""The fine-tuning loop the partially tuned LM rankers share (``transformer``, ``causal_lm``)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np


def tune(cache: list, target, predict: Callable, groups: list[dict], modules: list, epochs: int, seed: int) -> float:
    """``epochs`` passes over ``cache`` (``(index, fp16 states, mask)`` batches of the frozen part's
    output) in a seeded random order: MSE of ``predict(states, mask)`` against ``target[index]``,
    AdamW over ``groups`` (weight decay 0.01) with a linear warm-up over the first 10% of the steps
    and a linear decay to 0, gradients clipped at norm 1. ``modules`` train meanwhile and are left
    in eval mode. Returns the last batch's loss (nan without steps)."""
    import torch

    params = [p for g in groups for p in g["params"]]
    opt = torch.optim.AdamW(groups, weight_decay=0.01)
    steps = epochs * len(cache)
    warm = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * max(0.0, (steps - s) / max(1, steps - warm)))
    rng = np.random.default_rng(seed)
    for m in modules:
        m.train()
    loss = None
    for _ in range(epochs):
        for b in rng.permutation(len(cache)):
            idx, h16, mask = cache[b]
            loss = torch.nn.functional.mse_loss(predict(h16.float(), mask), target[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
    for m in modules:
        m.eval()
    return float(loss.detach()) if loss is not None else math.nan
