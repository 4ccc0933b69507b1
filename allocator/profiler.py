"""``braid profile``: measure PTL(batch size) and KV bytes per token on the actual engine.

The engine (the configured one; ``vllm`` by default) is driven directly, without the SGS
around it: for each batch size ``bs``, output length ``L`` and prompt length ``P`` of the grid,
``bs`` forced-length requests (EOS ignored) are submitted at once and the wall time ``T`` to
the last completion is measured; PTL(bs) = T / L at a mean context of P + L/2 tokens.

The per-step cost (``scheduling.cost.StepCost``) is then fitted to all measurements: the
total time of a measurement is the sum over its L steps of
``k1 b kv_j + max(k2, k3 bs) + k4 + k5 bs kv_j`` with ``kv_j = bs (P + j)``, plus
``prefill x bs x P + per_sequence x bs``, plus ``per_batch``: the measurement's own latency, once per
batch (submitting it, and seeing its last completion on the engine's next poll). ``per_batch`` is
fitted and reported but is not a step cost, so the profile leaves it out: the emulated engine and
the simulators pay their own. (Without it, fits here put that latency into every step: 4-token
batches of one sequence took 11.5 ms a token and 128-token ones 7.5, the fit gave one step
9.7 ms, and the emulated engine ran the arith and MMLU-Pro traces 12-15% slower than vLLM.) The
``max`` is handled by scanning the breakpoint n* = k2/k3 over a grid and solving a non-negative
least-squares problem (relative error) for each; the best fit wins.

KV bytes per token come from the model's architecture (2 x layers x kv_heads x head_dim x dtype
bytes); the KV capacity is what the engine reports it allocated (``kv_capacity_tokens``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import numpy as np

DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_LENGTHS = (4, 32, 128)
DEFAULT_PROMPTS = (8, 40)
QUICK_BATCHES = (1, 4, 16, 32)


@dataclass(frozen=True)
class Measurement:
    batch_size: int
    prompt_tokens: int
    length: int
    seconds: float


def measure(engine, batch_size: int, prompt_tokens: int, length: int, tag: str) -> Measurement:
    prompt = [1] + [5] * (prompt_tokens - 1)
    t0 = time.perf_counter()
    for i in range(batch_size):
        engine.submit(f"{tag}-{i}", prompt, length, ignore_eos=True)
    lengths: list[int] = []
    while len(lengths) < batch_size:
        lengths += [len(o.token_ids) for o in engine.poll(0.01)]
    seconds = time.perf_counter() - t0
    if any(n != length for n in lengths):
        raise RuntimeError(f"forced length {length} not honoured: got {sorted(set(lengths))}")
    return Measurement(batch_size, prompt_tokens, length, seconds)


def _design_row(m: Measurement, breakpoint: float) -> list[float]:
    """Coefficients of [k1*b, k3, k4, k5, prefill, per_sequence, per_batch] in the total time of ``m``."""
    bs, p, n = m.batch_size, m.prompt_tokens, m.length
    kv_sum = bs * (n * p + n * (n - 1) / 2.0)
    return [kv_sum, n * max(breakpoint, bs), n, bs * kv_sum, bs * p, bs, 1.0]


def fit_step_cost(ms: list[Measurement]) -> tuple[dict[str, float], float]:
    """Fit (k1*b, k2, k3, k4, k5, prefill, per_sequence, per_batch) to the measurements; returns
    (coefficients, rel. RMSE)."""
    from scipy.optimize import nnls

    y = np.array([m.seconds for m in ms])
    best: tuple[float, np.ndarray, float] | None = None
    for bp in [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0]:
        a = np.array([_design_row(m, bp) for m in ms]) / y[:, None]
        coef, _ = nnls(a, np.ones(len(ms)))
        pred = np.array([_design_row(m, bp) for m in ms]) @ coef
        err = float(np.sqrt(np.mean(((pred - y) / y) ** 2)))
        if best is None or err < best[0]:
            best = (err, coef, bp)
    assert best is not None
    err, c, bp = best
    names = ("k1b", "k3", "k4", "k5", "prefill_per_token", "per_sequence", "per_batch")
    coef = {k: float(v) for k, v in zip(names, c, strict=True)}
    coef["k2"] = coef["k3"] * bp
    return coef, err


def measure_grid(engine, grid: list[tuple[int, int, int]], repeats: int = 1) -> list[Measurement]:
    """Each grid point (batch size, prompt tokens, length) measured ``repeats`` times, the passes
    interleaved (a slow spell of the machine lands on every point alike), and its median kept: on a
    shared CPU identical measurements a minute apart differed by up to 30%."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    passes: list[list[Measurement]] = [[] for _ in grid]
    for r in range(repeats):
        for k, (bs, p, n) in enumerate(grid):
            passes[k].append(measure(engine, bs, p, n, f"m{k}-r{r}"))
    ms = [sorted(ps, key=lambda m: m.seconds)[len(ps) // 2] for ps in passes]
    for m in ms:
        print(f"  bs={m.batch_size:4d} prompt={m.prompt_tokens:4d} length={m.length:4d}: "
              f"{m.seconds / m.length * 1e3:8.2f} ms/step", flush=True)
    return ms


def run_profile(config_path: str | None, model_dir: str | None, out: str, *, hardware: str, quick: bool,
                repeats: int = 1) -> dict:
    import tempfile

    from services.common.config import load_config
    from services.generation.engine import create_engine
    from services.generation.scheduling.models import spec_from_hf_config
    from services.generation.scheduling.profiles import Profile, ProfileModel, PTLPoint, StepCostFields, save_profile

    cfg = load_config(config_path)
    gen = cfg.generation.model_copy(update={"max_new_tokens": 480})
    tmp = None
    if model_dir is None:
        from services.policy.model import build_policy, save_policy

        tmp = tempfile.TemporaryDirectory(prefix="braid-profile-")
        model_dir = str(Path(tmp.name) / "policy")
        save_policy(build_policy(cfg.model), model_dir)
    config = json.loads((Path(model_dir) / "config.json").read_text())
    name = "braid-tiny" if tmp is not None else Path(model_dir).name
    spec = spec_from_hf_config(name, config, dtype_bytes=4)
    engine = create_engine(gen.engine, model_dir, gen)
    try:
        measure(engine, 4, 8, 16, "warmup")
        batches = QUICK_BATCHES if quick else DEFAULT_BATCHES
        grid = [(bs, p, n) for n in DEFAULT_LENGTHS for bs in batches for p in DEFAULT_PROMPTS[:1]]
        grid += [(bs, DEFAULT_PROMPTS[1], DEFAULT_LENGTHS[1]) for bs in batches[::2]]
        ms = measure_grid(engine, grid, repeats)
        capacity = engine.kv_capacity_tokens() or gen.num_blocks * gen.page_size
    finally:
        engine.close()
        if tmp is not None:
            tmp.cleanup()
    coef, err = fit_step_cost(ms)
    kvb = float(spec.kv_bytes_per_token())
    profile = Profile(
        hardware=hardware, source="measured", engine=gen.engine,
        model=ProfileModel(name=name, fingerprint=spec.fingerprint()),
        kv_bytes_per_token=kvb, kv_capacity_tokens=capacity, max_batch=gen.max_inflight,
        watermark=0.15,  # admission safety margin of the simulated scheduler
        step_cost=StepCostFields(
            k1=coef["k1b"] / kvb, k2=coef["k2"], k3=coef["k3"], k4=coef["k4"], k5=coef["k5"],
            prefill_per_token=coef["prefill_per_token"], per_sequence=coef["per_sequence"],
        ),
        ptl=[PTLPoint(batch_size=m.batch_size, context_tokens=m.prompt_tokens + m.length / 2,
                      seconds_per_token=m.seconds / m.length) for m in ms],
        fit_rel_rmse=err, created=date.today().isoformat(),
        notes=(
            f"MEASURED by `braid profile` on this host's CPU ({gen.threads} torch thread(s)), engine {gen.engine}, "
            f"page size {gen.page_size}, {gen.num_blocks} blocks ({capacity} tokens allocated). KV bytes/token "
            f"{kvb:.0f} (architecture). Step-cost fit "
            f"relative RMSE {err:.3f} over {len(ms)} grid points, each the median of {repeats} interleaved "
            f"measurement(s); each batch's own latency (per_batch, {coef['per_batch'] * 1e3:.1f} ms: its submission "
            f"and the poll that sees it end) fitted apart and left out of the step cost."
        ),
    )
    path = save_profile(profile, out)
    return {"out": str(path), "fit_rel_rmse": err, "kv_bytes_per_token": kvb, "kv_capacity_tokens": capacity,
            "step_cost": profile.step_cost.model_dump(), "per_batch_s": coef["per_batch"], "points": len(ms)}
