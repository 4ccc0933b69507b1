"""``braid profile-train``: measure training step time on the trainer's real learner.

The learner (``services.trainer.learner.Learner``: the code every pipeline mode trains with) is
driven directly, without the SGS or the sample streams: for each grid point (``samples`` per
step x median ``response`` tokens, prompts of ``PROMPT_TOKENS``) synthetic complete groups of
``trainer.group_size`` ``SampleRecord``s are made once (random token ids of the model's
vocabulary, behaviour log-probs of the right length, rewards alternating 0/1 so every group has
non-zero advantages and survives DAPO's dynamic sampling) and one optimizer step is timed as
the trainer runs it: ``begin()``, ``backward()`` per ``trainer.micro_batch_groups`` groups,
``step()``. One untimed step warms each point up; the point's time is the fastest of ``repeats``
timed steps: another process can only slow a step down (a busy machine starved two of three steps
of one point by 20-100x), never speed it up, so the minimum is the step's own time and the median
is not.

Each grid point is measured twice: with every sequence of the point's length (no padding), and
with response lengths at the quantiles of a lognormal of spread ``sigma`` around the point's
median (capped at ``generation.max_new_tokens``; default ``RESPONSE_SIGMA`` 0.9, the count-down
task's spread), shuffled into groups as generation would complete them, so the learner pads its
micro-batches and makes more of them, as on real batches (``--sigma 0`` and ``--quick``: equal
lengths only). Every point records the work the learner really did (``allocator.padding``: its
micro-batches padded to their longest sequence), and the fit prices that padded work
(``allocator.train_profile``).

The run config sets everything the learner does: the backend (``trainer.backend``), device
(``trainer.device``; ``--device`` overrides), compute dtype (``trainer.dtype``), the algorithm
(GRPO or PPO with its critic), ``trainer.kl_coef`` (a reference-model forward when > 0), the
loss aggregation, the grouping (``group_size``, ``micro_batch_groups``) and ``trainer.threads``
(torch intra-op threads; ``--threads`` overrides); the profile records them. One rank is
measured (``trainer.ranks`` > 1 is refused), and a backend that cannot run here is refused with
the backend's own reason (megatron on a CPU: ``MegatronDeviceError``, megatron-core needs CUDA
outside the tests' shims; a device that does not exist; a backend that fails to import). The model is
the config's built policy (or ``model.path``), or a checkpoint directory (``--model``). The
profile is written to ``allocator/profiles/`` under ``train_profile.profile_filename`` unless
``--out`` says otherwise.
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
RESPONSE_SIGMA = 0.9  # the spread points' log-space sigma: the count-down task's (median 16, mean 29 tokens)
QUICK_REPEATS = 3  # the fastest of 3 survives two steps slowed by a busy machine (make test runs two workers)


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
    return make_groups([[(prompt_tokens, n) for n in g] for g in split_groups(responses, group_size)], vocab, rng)


def split_groups(items: list, group_size: int) -> list[list]:
    """``items`` in consecutive groups of ``group_size`` (a remainder joins the last group)."""
    sizes = [group_size] * max(1, len(items) // group_size)
    sizes[-1] += len(items) - sum(sizes)
    out, it = [], iter(items)
    for size in sizes:
        out.append([next(it) for _ in range(size)])
    return out


def make_groups(groups: list[list[tuple[int, int]]], vocab: int, rng: random.Random) -> list:
    """Learner groups of the given (prompt, response) token counts: random token ids, a uniform
    sampler's behaviour log-probs (jittered) and alternating 0/1 rewards (no group is skipped)."""
    from services.common.types import SampleRecord
    from services.trainer.learner import Group

    logp = -math.log(vocab)
    out = []
    for g, lengths in enumerate(groups):
        recs = [SampleRecord(
            prompt_id=f"p{g}", group_id=f"p{g}", sample_index=i,
            prompt_token_ids=tuple(rng.randrange(vocab) for _ in range(p)),
            token_ids=tuple(rng.randrange(vocab) for _ in range(n)),
            logprobs=tuple(logp + rng.uniform(-0.1, 0.1) for _ in range(n)),
            weight_version=0, finish_reason="length", submitted_at=0.0, started_at=0.0, finished_at=0.0,
        ) for i, (p, n) in enumerate(lengths)]
        out.append(Group(recs, [float(i % 2) for i in range(len(recs))]))
    return out


def call_lengths(groups: list, micro_batch_groups: int) -> list[list[int]]:
    """The sequence lengths (prompt + response) of each ``backward`` call ``time_step`` makes."""
    from allocator.padding import backward_calls

    return backward_calls([[len(s.prompt_token_ids) + len(s.token_ids) for s in g.samples] for g in groups],
                          micro_batch_groups)


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


def _sync(device):
    import torch

    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def device_label(device) -> str:
    import torch

    return f"{device} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else str(device)


def hardware_kind(device, hardware: str | None) -> str:
    """``--hardware``, else 'cpu-local' on a CPU or the GPU kind in the CUDA device's name."""
    if hardware:
        return hardware
    if device.type == "cpu":
        return "cpu-local"
    import torch

    from services.generation.scheduling.hardware import HARDWARE

    name = torch.cuda.get_device_name(device)
    kinds = [k for k in sorted(HARDWARE, key=len, reverse=True) if k.lower() in name.lower()]
    if not kinds:
        raise ValueError(f"--hardware: {name!r} is none of the known GPU kinds {sorted(HARDWARE)}; name its kind")
    return kinds[0]


def check_measurable(tc) -> None:
    """Refuse, saying why, what one learner in this process cannot measure."""
    if tc.ranks > 1:
        raise ValueError(f"braid profile-train measures one trainer rank; trainer.ranks is {tc.ranks} "
                         f"(set trainer.ranks=1: the profile's throughput is per device)")


def build_learner(cfg, policy):
    """The trainer's learner over ``policy``; a backend or device that cannot run here is a
    ``ValueError`` naming it."""
    from services.trainer.learner import Learner

    tc = cfg.trainer
    try:
        return Learner(cfg, policy)
    except (ImportError, RuntimeError, NotImplementedError) as err:
        raise ValueError(f"trainer.backend {tc.backend} on {tc.device} cannot run here: "
                         f"{type(err).__name__}: {err}") from err


def spread_groups(lengths: list[int], group_size: int) -> list[list[int]]:
    """``lengths`` in groups of ``group_size`` in completion order (by their longest): the order
    the trainer hands groups to the learner."""
    from allocator.padding import completion_order

    return completion_order(split_groups(lengths, group_size))


def measure_grid(learner, tc, vocab: int, grid: list[tuple[int, int, float]], *, repeats: int, cap: int,
                 sync) -> list:
    """One ``TrainPoint`` per (samples, median response, sigma) of ``grid``: a warm-up step, then
    the fastest of ``repeats`` timed steps; prints a progress line per point."""
    from allocator.train_profile import make_point

    rng = random.Random(tc.seed)
    time_step(learner, synthetic_groups(PROMPT_TOKENS, [32] * 8, tc.group_size, vocab, rng), tc.micro_batch_groups,
              sync)
    points = []
    for samples, resp, sigma in grid:
        lengths = response_lengths(samples, resp, sigma, cap, rng)
        groups = make_groups([[(PROMPT_TOKENS, n) for n in g] for g in spread_groups(lengths, tc.group_size)],
                             vocab, rng)
        time_step(learner, groups, tc.micro_batch_groups, sync)  # warm-up: allocator, new shapes
        times = [time_step(learner, groups, tc.micro_batch_groups, sync) for _ in range(repeats)]
        p = make_point(samples, PROMPT_TOKENS, resp, min(times), call_lengths(groups, tc.micro_batch_groups),
                       sigma=sigma, max_tokens=tc.micro_batch_tokens)
        points.append(p)
        print(f"  samples={samples:4d} response={resp:4d} sigma={sigma:.1f} tokens={p.tokens:6d}"
              f" padded={p.padded_tokens:6d}:"
              f" {p.seconds * 1e3:9.1f} ms/step ({p.tokens / p.seconds:7.0f} tok/s; runs "
              f"{', '.join(f'{t * 1e3:.0f}' for t in times)} ms)", flush=True)
    return points


def run_train_profile(config_path: str | None, model_dir: str | None, out: str | None, *, hardware: str | None = None,
                      quick: bool = False, threads: int | None = None, device: str | None = None,
                      sigma: float | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """Measure the grid, fit, write the profile; returns a summary (path, fit, points)."""
    import torch

    from allocator.train_profile import make_train_profile, profile_filename
    from services.common.config import load_config
    from services.generation.scheduling.models import spec_from_hf_config
    from services.generation.scheduling.profiles import PROFILE_DIR, save_profile

    cfg = load_config(config_path, [*(overrides or []), *([f"trainer.device={device}"] if device else [])])
    tc = cfg.trainer
    check_measurable(tc)
    nthreads = threads or tc.threads
    torch.set_num_threads(nthreads)
    torch.manual_seed(tc.seed)
    policy, name = _policy(cfg, model_dir)
    learner = build_learner(cfg, policy)
    dev = learner.device
    dev_label, sync = device_label(dev), _sync(dev)
    kind = hardware_kind(dev, hardware)
    spec = spec_from_hf_config(name, policy.model.config.to_dict(), dtype_bytes=4)
    samples, responses = (QUICK_SAMPLES, QUICK_RESPONSES) if quick else (DEFAULT_SAMPLES, DEFAULT_RESPONSES)
    repeats = QUICK_REPEATS if quick else REPEATS
    sigma = (0.0 if quick else RESPONSE_SIGMA) if sigma is None else sigma
    grid = [(s, r, sg) for sg in sorted({0.0, sigma}) for s in samples for r in responses]
    cap = cfg.generation.max_new_tokens
    points = measure_grid(learner, tc, spec.vocab, grid, repeats=repeats, cap=cap, sync=sync)
    what = (f"backend {tc.backend} on {dev_label}, {tc.dtype}, 1 rank, {nthreads} torch thread(s)"
            + (", activation checkpointing" if tc.activation_checkpointing else ""))
    profile = make_train_profile(
        spec, points, hardware=kind, algorithm=tc.algorithm.name, reference_model=tc.kl_coef > 0,
        device=dev_label, threads=nthreads, response_sigma=sigma, backend=tc.backend, dtype=tc.dtype, ranks=1,
        group_size=tc.group_size, micro_batch_groups=tc.micro_batch_groups, micro_batch_tokens=tc.micro_batch_tokens,
        activation_checkpointing=tc.activation_checkpointing,
        notes=(f"MEASURED by `braid profile-train` on the trainer's Learner ({what}), "
               f"config {config_path or 'defaults'}: {tc.algorithm.name}, kl_coef {tc.kl_coef}, loss_agg "
               f"{tc.algorithm.loss_agg}, group_size {tc.group_size}, micro_batch_groups {tc.micro_batch_groups}. "
               f"Synthetic groups, prompts of {PROMPT_TOKENS} tokens, responses all of the point's length (no "
               f"padding)" + (f" and, again, at the quantiles of a lognormal around each point's median (sigma "
                              f"{sigma}, capped at {cap}; groups in completion order)" if sigma else "")
               + f"; the fastest of {repeats} steps per point after one warm-up step; the fit prices the padded "
               f"micro-batches the learner computed."),
    )
    path = save_profile(profile, out or PROFILE_DIR / profile_filename(kind, name, tc.backend, tc.dtype))
    return {"out": str(path), "model": name, "hardware": kind, "backend": tc.backend, "device": dev_label,
            "dtype": tc.dtype, "ranks": 1, "threads": nthreads, "fixed_s": profile.fixed_s,
            "effective_gflops": profile.effective_flops / 1e9, "fit_max_rel_error": profile.fit_max_rel_error,
            "fit_median_rel_error": profile.fit_median_rel_error, "points": len(points)}
