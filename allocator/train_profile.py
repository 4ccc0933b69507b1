"""Measured training step-time profiles: one JSON file per hardware kind x model x algorithm x backend.

The roofline of ``allocator.training`` prices a step at ``step_flops / (gpus x peak x MFU)``.
A profile replaces the assumed ``peak x MFU`` by what the trainer achieved: ``braid
profile-train`` (``allocator.train_profiler``) times real optimizer steps of the learner on
synthetic batches over a grid of samples per step x response length, and this module fits

    seconds = fixed_s + padded_step_flops(wl) / effective_flops

to the points, where ``padded_step_flops`` is the roofline's FLOP count
(``allocator.training.step_flops``: the algorithm's forward-pass equivalents x (matmul + causal
attention FLOPs)) of what the learner computed: its micro-batches padded to their longest
sequence (``allocator.padding``; with equal lengths, the useful FLOPs). ``effective_flops`` is
therefore "roofline FLOPs per second per device" and absorbs what the FLOP count leaves out (no
recomputation or reference pass on a CPU trainer, fp32, kernel efficiency); ``fixed_s`` is the
per-step cost that does not grow with tokens (the optimizer step, gradient clipping, Python and
launch overhead). The fit is non-negative least squares on the relative error (each point's
equation divided by its measured seconds), solved exactly by trying every support set of the
two coefficients (numpy only). The profile records the fit's max and median relative error over
its points, and what was measured: the trainer backend (``trainer.backend``), device, compute
dtype, ranks, and the grouping (``group_size``, ``micro_batch_groups``) the allocator's expected
padding uses.

``profile_filename`` names a profile (``<hardware>-<model>[-<backend>][-<dtype>]-train.json``,
the torch backend and float32 left out); ``find_train_profile`` picks the profile of a
directory matching hardware, model, algorithm and backend (the allocator's default when a
cluster file names none). ``load_train_profile(path, model=...)`` validates the file like the
PTL profiles (``services.generation.scheduling.profiles``: errors name the file and field) and
refuses a profile measured on another model, naming both;
``services.generation.scheduling.profiles.save_profile`` writes both kinds. Pure apart from
the loaders.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import ConfigDict, Field

from allocator.padding import PaddedWork, micro_batch_work
from allocator.training import TrainWorkload, padded_step_flops
from services.common.config import StrictModel
from services.generation.scheduling.models import ModelSpec
from services.generation.scheduling.profiles import ProfileModel, check_fingerprint, read_validated
from services.policy.bucketing import MICRO_BATCH_TOKENS

FORMAT = "braid-train-profile/1"


class TrainPoint(StrictModel):
    """One grid point: ``samples`` sequences of ``prompt_tokens`` + about ``response_tokens`` tokens."""

    model_config = ConfigDict(frozen=True)

    samples: int = Field(ge=1, le=10_000_000, description="Sequences trained in the step.")
    prompt_tokens: int = Field(ge=1, le=10_000_000, description="Prompt tokens per sequence.")
    response_tokens: int = Field(ge=1, le=10_000_000,
                                 description="Median response tokens per sequence (the grid value).")
    tokens: int = Field(ge=1, description="Prompt + response tokens of the whole step.")
    attn_sq: float = Field(ge=0, description="Sum over sequences of (prompt + response)^2.")
    padded_tokens: int = Field(0, ge=0, description="Tokens the learner computed: sum over its micro-batches of "
                               "size x longest (0: not recorded, = tokens).")
    padded_attn_sq: float = Field(0.0, ge=0, description="Sum over the micro-batches of size x longest^2 "
                                  "(0: = attn_sq).")
    micro_batches: int = Field(0, ge=0, description="Micro-batches (forward/backward passes) of the step "
                               "(0: not recorded).")
    sigma: float = Field(0.0, ge=0, le=5, description="Log-space spread of the response lengths (0: all equal).")
    seconds: float = Field(gt=0, description="Measured seconds of the step (begin + backward + step; median).")

    def workload(self, algorithm: str) -> TrainWorkload:
        return TrainWorkload(tokens=self.tokens, attn_sq=self.attn_sq,
                             mb_tokens=self.prompt_tokens + self.response_tokens, algorithm=algorithm,
                             padded_tokens=self.padded_tokens, padded_attn_sq=self.padded_attn_sq)


def make_point(samples: int, prompt_tokens: int, response_tokens: int, seconds: float,
               calls: Sequence[Sequence[int]] | None = None, sigma: float = 0.0,
               max_tokens: int = MICRO_BATCH_TOKENS) -> TrainPoint:
    """A point of ``samples`` sequences whose lengths (prompt + response) went to the learner's
    ``backward`` calls as ``calls`` (default: one call, every sequence ``prompt_tokens +
    response_tokens``); tokens, attn_sq and the padded work are computed from them, the learner
    bucketing each call into passes of at most ``max_tokens`` padded tokens."""
    if calls is None:
        calls = [[prompt_tokens + response_tokens] * samples]
    if sum(len(c) for c in calls) != samples:
        raise ValueError(f"{samples} samples but {sum(len(c) for c in calls)} sequence lengths")
    work: PaddedWork = micro_batch_work(calls, max_tokens)
    return TrainPoint(samples=samples, prompt_tokens=prompt_tokens, response_tokens=response_tokens,
                      tokens=round(work.tokens), attn_sq=work.attn_sq, padded_tokens=round(work.padded_tokens),
                      padded_attn_sq=work.padded_attn_sq, micro_batches=round(work.micro_batches), sigma=sigma,
                      seconds=seconds)


class TrainProfile(StrictModel):
    """A measured training step-time profile and its fit (see the module docstring)."""

    model_config = ConfigDict(frozen=True)

    format: Literal["braid-train-profile/1"] = Field(FORMAT, description="File format tag.")
    hardware: str = Field(min_length=1, description="Hardware kind: 'cpu-local', 'H100', ...")
    model: ProfileModel
    algorithm: Literal["grpo", "ppo"] = Field(description="RL algorithm the steps ran (sets the FLOP count).")
    reference_model: bool = Field(description="Whether the steps ran a reference-model forward (trainer.kl_coef > 0).")
    backend: Literal["torch", "megatron"] = Field("torch", description="trainer.backend the steps ran on.")
    device: str = Field(min_length=1, description="torch device the steps ran on ('cpu', 'cuda:0 (NVIDIA H100 ...)').")
    dtype: Literal["float32", "bfloat16"] = Field("float32",
                                                  description="trainer.dtype: compute precision of the passes.")
    ranks: int = Field(1, ge=1, le=1024, description="Data-parallel trainer ranks of the measured steps.")
    activation_checkpointing: bool = Field(False, description="trainer.activation_checkpointing of the measured steps.")
    threads: int = Field(ge=1, le=1024, description="torch intra-op threads.")
    group_size: int = Field(8, ge=1, le=100_000, description="trainer.group_size of the measured steps (the "
                            "allocator's expected padding deals a workload's lengths into such groups).")
    micro_batch_groups: int = Field(8, ge=1, le=100_000,
                                    description="trainer.micro_batch_groups: groups per backward call.")
    micro_batch_tokens: int = Field(MICRO_BATCH_TOKENS, ge=16, le=4_194_304,
                                    description="trainer.micro_batch_tokens: padded tokens per forward/backward pass.")
    response_sigma: float = Field(0.0, ge=0, le=5, description="Log-space spread of the grid's spread points (each "
                                  "grid point measured again at that spread; 0: equal lengths only).")
    points: tuple[TrainPoint, ...] = Field(min_length=2, description="Measured grid points.")
    fixed_s: float = Field(ge=0, description="Fitted seconds per step independent of tokens.")
    effective_flops: float = Field(gt=0, description="Fitted padded_step_flops per second per device.")
    fit_max_rel_error: float = Field(ge=0, description="Largest |predicted - measured| / measured over the points.")
    fit_median_rel_error: float = Field(ge=0, description="Median |predicted - measured| / measured over the points.")
    created: str = Field(description="ISO date.")
    notes: str = Field("", description="Free text: how it was made.")

    def seconds(self, flops: float, devices: int = 1) -> float:
        """Predicted seconds of a step of ``flops`` (``padded_step_flops``) on ``devices`` (compute + fixed)."""
        return self.fixed_s + flops / (devices * self.effective_flops)


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||a x - b|| subject to x >= 0, exactly, for a few columns: the optimum is the
    unconstrained least-squares solution on its own support, so try every support."""
    n = a.shape[1]
    best, best_res = np.zeros(n), float(np.sum(b * b))
    for k in range(1, n + 1):
        for cols in itertools.combinations(range(n), k):
            sub, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if np.any(sub < 0):
                continue
            x = np.zeros(n)
            x[list(cols)] = sub
            res = float(np.sum((a @ x - b) ** 2))
            if res < best_res:
                best, best_res = x, res
    return best


def fit_step_time(flops: Sequence[float], seconds: Sequence[float]) -> tuple[float, float, float, float]:
    """Fit ``seconds = fixed_s + flops / effective_flops`` (NNLS, relative error); returns
    (fixed_s, effective_flops, max relative error, median relative error)."""
    f, y = np.asarray(flops, dtype=float), np.asarray(seconds, dtype=float)
    if len(f) < 2 or np.any(y <= 0):
        raise ValueError(f"a step-time fit needs >= 2 points with positive seconds, got {len(f)}")
    design = np.stack([np.ones_like(f), f], axis=1)
    fixed, per_flop = nnls(design / y[:, None], np.ones_like(y))
    if per_flop <= 0:
        raise ValueError("step time does not grow with FLOPs over the points: no throughput to fit (widen the grid)")
    rel = np.abs(design @ np.array([fixed, per_flop]) - y) / y
    return float(fixed), float(1.0 / per_flop), float(rel.max()), float(np.median(rel))


def make_train_profile(model: ModelSpec, points: Sequence[TrainPoint], *, hardware: str, algorithm: str,
                       reference_model: bool, device: str, threads: int, response_sigma: float = 0.0,
                       backend: str = "torch", dtype: str = "float32", ranks: int = 1, group_size: int = 8,
                       micro_batch_groups: int = 8, micro_batch_tokens: int = MICRO_BATCH_TOKENS,
                       activation_checkpointing: bool = False,
                       notes: str = "") -> TrainProfile:
    """Fit ``points`` (measured on ``model``) and wrap them into a profile."""
    flops = [padded_step_flops(model, p.workload(algorithm)) for p in points]
    fixed, eff, max_err, med_err = fit_step_time(flops, [p.seconds for p in points])
    return TrainProfile(
        hardware=hardware, model=ProfileModel(name=model.name, fingerprint=model.fingerprint()),
        algorithm=algorithm, reference_model=reference_model, backend=backend, device=device,  # type: ignore[arg-type]
        dtype=dtype, ranks=ranks, threads=threads, group_size=group_size,  # type: ignore[arg-type]
        micro_batch_groups=micro_batch_groups, micro_batch_tokens=micro_batch_tokens,
        activation_checkpointing=activation_checkpointing,
        response_sigma=response_sigma,
        points=tuple(points), fixed_s=fixed, effective_flops=eff, fit_max_rel_error=max_err,
        fit_median_rel_error=med_err, created=date.today().isoformat(), notes=notes,
    )


def profile_filename(hardware: str, model: str, backend: str = "torch", dtype: str = "float32") -> str:
    """``<hardware>-<model>[-<backend>][-<dtype>]-train.json``: the defaults (the torch backend,
    float32) are left out, so the profiles measured before backends existed keep their names."""
    parts = [hardware, model] + ([backend] if backend != "torch" else []) + ([dtype] if dtype != "float32" else [])
    return "-".join(parts) + "-train.json"


def matches(profile: TrainProfile, *, hardware: str, model: ModelSpec, algorithm: str, backend: str) -> bool:
    """Whether ``profile`` was measured on this hardware kind, model, algorithm and backend."""
    fp = {k: v for k, v in model.fingerprint().items() if k != "name"}
    measured = {k: v for k, v in profile.model.fingerprint.items() if k != "name"}
    return (profile.hardware == hardware and measured == fp and profile.algorithm == algorithm
            and profile.backend == backend)


def find_train_profile(directory: str | Path, *, hardware: str, model: ModelSpec, algorithm: str,
                       backend: str = "torch") -> Path | None:
    """The profile in ``directory`` (``*-train.json``) measured on this hardware kind, model,
    algorithm and backend; several: the newest (``created``), then the name ``profile_filename``
    gives (float32, then the others by name). None when there is none."""
    found: list[tuple[str, bool, str, Path]] = []
    for path in sorted(Path(directory).glob("*-train.json")):
        prof = load_train_profile(path)
        if matches(prof, hardware=hardware, model=model, algorithm=algorithm, backend=backend):
            canonical = path.name == profile_filename(hardware, model.name, backend, prof.dtype)
            found.append((prof.created, prof.dtype == "float32" and canonical, path.name, path))
    if not found:
        return None
    found.sort(key=lambda f: f[2])
    found.sort(key=lambda f: (f[0], f[1]), reverse=True)  # stable: equal keys stay in name order
    return found[0][3]


def load_train_profile(path: str | Path, *, model: ModelSpec | dict | None = None) -> TrainProfile:
    """Read and validate a training profile; with ``model``, also check it was measured on that model."""
    profile = read_validated(TrainProfile, path, "training profile")
    if model is not None:
        check_fingerprint(profile.model, model, str(path), "trained")
    return profile

