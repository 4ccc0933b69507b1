"""``braid profile-train``: measure training step time on the trainer's real learner.

The learner (``services.trainer.learner.Learner``: the code every pipeline mode trains with) is
driven directly, without the SGS or the sample streams: for each grid point (``samples`` per
step x median ``response`` tokens, prompts of ``PROMPT_TOKENS``) synthetic complete groups of
``trainer.group_size`` ``SampleRecord``s are made once (random token ids of the model's
vocabulary, behaviour log-probs of the right length, rewards alternating 0/1 so every group has
non-zero advantages and survives DAPO's dynamic sampling) and one optimizer step is timed as
the trainer runs it: ``begin()``, ``backward()`` per ``trainer.micro_batch_groups`` groups,
``step()``. One untimed step warms each point up; the point's time is the median of ``repeats``.

By default every sequence of a point has the point's length: no padding, so the fit prices
useful tokens, as the roofline's FLOP count does (GPU trainers pack sequences). The learner pads
each micro-batch to its longest sequence; on the count-down task's long-tailed lengths that
costs ~1.6x (docs/allocator.md). ``sigma > 0`` draws each point's response lengths at the
quantiles of a lognormal around its median (capped at ``generation.max_new_tokens``), so the
profile includes the padding of such a spread (at the price of a looser fit: the padding
depends on the median, not only on the tokens).

The run config sets everything the learner does: the algorithm (GRPO or PPO with its critic),
``trainer.kl_coef`` (a reference-model forward when > 0), the loss aggregation, and
``trainer.threads`` (torch intra-op threads; ``--threads`` overrides). The model is the config's
built policy (or ``model.path``), or a checkpoint directory (``--model``). The fit and the file
format are ``allocator.train_profile``.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from pathlib import Path
from typing import Any

DEFAULT_SAMPLES = (8, 32, 64)
DEFAULT_RESPONSES = (16, 64, 192)
QUICK_SAMPLES = (4, 16)
QUICK_RESPONSES = (8, 48)
PROMPT_TOKENS = 12  # the count-down task's prompts are 11 tokens (bos + "247-9>200=")
REPEATS = 3
RESPONSE_SIGMA = 0.0  # equal lengths: the fit sees useful tokens only (the task's runs spread 0.9: median 16, mean 29)
QUICK_REPEATS = 2


def response_lengths(samples: int, median: int, sigma: float, cap: int, rng: random.Random) -> list[int]:
    """``samples`` response lengths at the quantiles (i + 1/2) / samples of a lognormal around
    ``median`` (capped; all ``median`` at sigma 0), shuffled: every point sees the same shape of
    distribution, so its padding is typical rather than the luck of one draw."""
    if sigma == 0:
        return [median] * samples
    normal = statistics.NormalDist(math.log(median), sigma)
    out = [min(cap, max(1, round(math.exp(normal.inv_cdf((i + 0.5) / samples))))) for i in range(samples)]
    rng.shuffle(out)
    return out


def synthetic_groups(prompt_tokens: int, responses: list[int], group_size: int, vocab: int, rng: random.Random) -> list:
    """One sequence per ``responses`` length, in complete groups of ``group_size`` (a remainder
    joins the last group), with random tokens, behaviour log-probs and alternating 0/1 rewards."""
    from services.common.types import SampleRecord
    from services.trainer.learner import Group

    sizes = [group_size] * max(1, len(responses) // group_size)
    sizes[-1] += len(responses) - sum(sizes)
    groups, lengths = [], iter(responses)
    logp = -math.log(vocab)  # a uniform sampler's log-prob
    for g, size in enumerate(sizes):
        recs = []
        for i in range(size):
            n = next(lengths)
            recs.append(SampleRecord(
                prompt_id=f"p{g}", group_id=f"p{g}", sample_index=i,
                prompt_token_ids=tuple(rng.randrange(vocab) for _ in range(prompt_tokens)),
                token_ids=tuple(rng.randrange(vocab) for _ in range(n)),
                logprobs=tuple(logp + rng.uniform(-0.1, 0.1) for _ in range(n)),
                weight_version=0, finish_reason="length", submitted_at=0.0, started_at=0.0, finished_at=0.0,
            ))
        groups.append(Group(recs, [float(i % 2) for i in range(size)]))
    return groups


def time_step(learner, groups: list, micro_batch_groups: int, sync) -> float:
    """Seconds of one optimizer step over ``groups``, as the trainer runs it."""
    t0 = time.perf_counter()
    learner.begin()
    for i in range(0, len(groups), micro_batch_groups):
        learner.backward(groups[i:i + micro_batch_groups])
    learner.step()
    sync()
    return time.perf_counter() - t0


def _policy(cfg, model_dir: str | None):
    """(policy, model name): a checkpoint dir, the config's ``model.path``, or the built model."""
    from services.generation.scheduling.models import MODELS, spec_from_hf_config
    from services.policy.model import build_policy, load_policy

    path = model_dir or cfg.model.path
    if path is not None:
        return load_policy(path), Path(path).name
    policy = build_policy(cfg.model)
    spec = spec_from_hf_config("?", policy.model.config.to_dict())
    known = [m.name for m in MODELS.values() if {**m.fingerprint(), "name": "?"} == spec.fingerprint()]
    return policy, (known[0] if known else f"built-h{spec.hidden}-l{spec.layers}")


def _device(name: str):
    import torch

    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this host")
    dev = torch.device(name)
    label = str(dev)
    if dev.type == "cuda":
        label += f" ({torch.cuda.get_device_name(dev)})"
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    return dev, label, sync


def measure_grid(learner, tc, vocab: int, grid: list[tuple[int, int]], *, repeats: int, sigma: float, cap: int,
                 sync) -> list:
    """One ``TrainPoint`` per (samples, median response) of ``grid``: a warm-up step, then the
    median of ``repeats`` timed steps; prints a progress line per point."""
    from allocator.train_profile import make_point

    rng = random.Random(tc.seed)
    time_step(learner, synthetic_groups(PROMPT_TOKENS, [32] * 8, tc.group_size, vocab, rng), tc.micro_batch_groups, sync)
    points = []
    for samples, resp in grid:
        lengths = response_lengths(samples, resp, sigma, cap, rng)
        groups = synthetic_groups(PROMPT_TOKENS, lengths, tc.group_size, vocab, rng)
        time_step(learner, groups, tc.micro_batch_groups, sync)  # warm-up: allocator, new shapes
        times = [time_step(learner, groups, tc.micro_batch_groups, sync) for _ in range(repeats)]
        p = make_point(samples, PROMPT_TOKENS, resp, statistics.median(times), lengths)
        points.append(p)
        print(f"  samples={samples:4d} response={resp:4d} tokens={p.tokens:6d}: {p.seconds * 1e3:9.1f} ms/step "
              f"({p.tokens / p.seconds:7.0f} tok/s; runs {', '.join(f'{t * 1e3:.0f}' for t in times)} ms)", flush=True)
    return points


def run_train_profile(config_path: str | None, model_dir: str | None, out: str | None, *, hardware: str,
                      quick: bool, threads: int | None = None, device: str = "cpu", sigma: float = RESPONSE_SIGMA,
                      overrides: list[str] | None = None) -> dict[str, Any]:
    """Measure the grid, fit, write the profile; returns a summary (path, fit, points)."""
    import torch

    from services.generation.scheduling.models import spec_from_hf_config
    from services.generation.scheduling.profiles import PROFILE_DIR, save_profile
    from allocator.train_profile import make_train_profile
    from services.common.config import load_config
    from services.trainer.learner import Learner

    cfg = load_config(config_path, overrides)
    tc = cfg.trainer
    nthreads = threads or tc.threads
    torch.set_num_threads(nthreads)
    torch.manual_seed(tc.seed)
    dev, dev_label, sync = _device(device)
    policy, name = _policy(cfg, model_dir)
    policy.model.to(dev)
    spec = spec_from_hf_config(name, policy.model.config.to_dict(), dtype_bytes=4)
    samples, responses = (QUICK_SAMPLES, QUICK_RESPONSES) if quick else (DEFAULT_SAMPLES, DEFAULT_RESPONSES)
    repeats = QUICK_REPEATS if quick else REPEATS
    grid = [(s, r) for s in samples for r in responses]
    cap = cfg.generation.max_new_tokens
    points = measure_grid(Learner(cfg, policy), tc, spec.vocab, grid, repeats=repeats, sigma=sigma, cap=cap, sync=sync)
    profile = make_train_profile(
        spec, points, hardware=hardware, algorithm=tc.algorithm.name, reference_model=tc.kl_coef > 0,
        device=dev_label, threads=nthreads, response_sigma=sigma,
        notes=(f"MEASURED by `braid profile-train` on the trainer's Learner ({dev_label}, {nthreads} torch thread(s)), "
               f"config {config_path or 'defaults'}: {tc.algorithm.name}, kl_coef {tc.kl_coef}, loss_agg "
               f"{tc.algorithm.loss_agg}, group_size {tc.group_size}, micro_batch_groups {tc.micro_batch_groups}. "
               f"Synthetic groups, prompts of {PROMPT_TOKENS} tokens, responses "
               + (f"lognormal around each point's median (sigma {sigma}, capped at {cap}: the learner pads each "
                  f"micro-batch to its longest)" if sigma else "all of the point's length (no padding)")
               + f"; median of {repeats} steps per point after one warm-up step."),
    )
    path = save_profile(profile, out or PROFILE_DIR / f"{hardware}-{name}-train.json")
    return {"out": str(path), "model": name, "device": dev_label, "threads": nthreads, "fixed_s": profile.fixed_s,
            "effective_gflops": profile.effective_flops / 1e9, "fit_max_rel_error": profile.fit_max_rel_error,
            "fit_median_rel_error": profile.fit_median_rel_error, "points": len(points)}
