"""Per-token-latency (PTL) profiles: one JSON file per hardware kind x model x engine.

A profile holds what the scheduling policies and the simulator need about one generation
instance: the fitted per-step cost (``services.generation.scheduling.cost.StepCost``:
StaleFlow App. B's k1..k4 plus the CPU engine's k5 and a prefill cost), KV bytes per token,
KV capacity, the batch limit, and the PTL(batch size) table it was fitted to.

- ``source: measured`` — written by ``braid profile`` on the actual engine (``allocator.profiler``).
- ``source: derived`` — from the roofline of a GPU spec sheet (``derive_profile``); marked so
  until measured on that GPU. Derivation (per instance of ``tp`` GPUs, bf16):
  k2 = weight bytes / (tp x HBM bandwidth x BW_EFFICIENCY); k3 = decode FLOPs per token /
  (tp x peak x FLOPS_EFFICIENCY); k1 = 1 / (tp x HBM bandwidth x BW_EFFICIENCY) per KV byte;
  k4 = STEP_OVERHEAD_S (+ two all-reduces per layer when tp > 1); prefill = k3 per prompt
  token; KV capacity = (tp x HBM x MEMORY_UTILIZATION - weights - tp x ACTIVATION_RESERVE) /
  KV bytes per token; tp = the smallest power of two leaving room for MIN_KV_TOKENS.

``load_profile(path, model=...)`` validates the file (errors name the file, and the line and
column for broken JSON, or the field) and, given the served model, refuses a profile fitted to
another model naming the field that differs.
"""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError

from services.common.config import StrictModel
from services.generation.scheduling.cost import InstanceSpec, StepCost
from services.generation.scheduling.hardware import Hardware, get_hardware
from services.generation.scheduling.models import ModelSpec, get_model

FORMAT = "braid-ptl-profile/1"
TRAIN_SUFFIX = "-train"  # shipped training step-time profiles (allocator.train_profile) end in this
# Shipped profiles (measured on this CPU; derived from spec sheets for GPUs) are data of the allocator.
PROFILE_DIR = Path(__file__).resolve().parents[3] / "allocator" / "profiles"

BW_EFFICIENCY = 0.8  # achieved / peak HBM bandwidth in decode (GEMV, paged attention)
FLOPS_EFFICIENCY = 0.6  # achieved / peak BF16 FLOPs in batched decode GEMMs
STEP_OVERHEAD_S = 2e-3  # launches, sampling, scheduler per step (vLLM with CUDA graphs: 1-3 ms)
ALLREDUCE_S = 15e-6  # one small all-reduce over NVLink (latency-bound at decode sizes)
MEMORY_UTILIZATION = 0.9  # vLLM's gpu_memory_utilization default
ACTIVATION_RESERVE_GB = 2.0  # per GPU: activations, CUDA graphs, sampler buffers
MIN_KV_TOKENS = 160_000  # room for 8 sequences of 20K tokens
GPU_MAX_BATCH = 256  # vLLM's max_num_seqs default
GPU_WATERMARK = 0.01  # vLLM's block-manager watermark


M = TypeVar("M", bound=BaseModel)


class ProfileError(ValueError):
    """A profile file is unreadable, invalid, or for another model; the message names the file and field."""


class ProfileModel(StrictModel):
    name: str = Field(description="Model name (services.generation.scheduling.models) or checkpoint label.")
    fingerprint: dict[str, int | str] = Field(description="Architecture fields the profile depends on.")


class StepCostFields(StrictModel):
    k1: float = Field(ge=0, description="Seconds per byte of KV cache read per step.")
    k2: float = Field(ge=0, description="Seconds: weight-read floor of one step's matmuls.")
    k3: float = Field(ge=0, description="Seconds per running sequence (compute-bound matmuls).")
    k4: float = Field(ge=0, description="Seconds: constant per step.")
    k5: float = Field(0.0, ge=0, description="Seconds per (running sequence x cached token): dense-mask attention.")
    prefill_per_token: float = Field(0.0, ge=0, description="Seconds per prompt token prefilled.")
    per_sequence: float = Field(
        0.0, ge=0, description="Seconds per admitted sequence (set-up and completion overhead)."
    )


class PTLPoint(StrictModel):
    batch_size: int = Field(ge=1, le=1_000_000, description="Sequences decoding together.")
    context_tokens: float = Field(ge=0, description="Mean cached tokens per sequence over the measurement.")
    seconds_per_token: float = Field(gt=0, description="Seconds per decode step (= per token of each sequence).")


class Profile(StrictModel):
    format: Literal["braid-ptl-profile/1"] = Field(FORMAT, description="File format tag.")
    hardware: str = Field(min_length=1, description="Hardware kind: 'cpu-local', 'H20', 'H800', 'H100', ...")
    source: Literal["measured", "derived"] = Field(description="measured on the engine, or derived from a spec sheet.")
    engine: str = Field(min_length=1, description="Engine the profile describes ('cb', or 'roofline' for derived).")
    model: ProfileModel
    tensor_parallel: int = Field(1, ge=1, le=64, description="GPUs per instance.")
    kv_bytes_per_token: float = Field(gt=0, description="KV-cache bytes per token (all layers, K and V).")
    kv_capacity_tokens: int = Field(ge=1, description="Tokens the instance's KV cache holds.")
    max_batch: int = Field(ge=1, le=1_000_000, description="Most sequences in flight per instance.")
    watermark: float = Field(0.0, ge=0.0, lt=1.0, description="KV fraction kept free when admitting.")
    step_cost: StepCostFields
    ptl: list[PTLPoint] = Field(min_length=1, description="PTL(batch size) table (measured, or the model evaluated).")
    fit_rel_rmse: float | None = Field(
        None, ge=0, description="Relative RMS error of the step-cost fit on the PTL table."
    )
    created: str = Field(description="ISO date.")
    notes: str = Field("", description="Free text: how it was made.")

    def step_cost_model(self) -> StepCost:
        return StepCost(kv_bytes_per_token=self.kv_bytes_per_token, **self.step_cost.model_dump())

    def instance_spec(self, max_batch: int | None = None, kv_capacity_tokens: int | None = None) -> InstanceSpec:
        """The policies' view of one instance (optionally with other limits than profiled)."""
        return InstanceSpec(
            cost=self.step_cost_model(),
            kv_capacity_tokens=kv_capacity_tokens or self.kv_capacity_tokens,
            max_batch=max_batch or self.max_batch,
            watermark=self.watermark,
        )


def check_model(profile: Profile, model: ModelSpec | dict, source: str) -> None:
    """Raise ``ProfileError`` if ``profile`` was made for another model than ``model``."""
    check_fingerprint(profile.model, model, source, "served")


def check_fingerprint(have: ProfileModel, model: ModelSpec | dict, source: str, role: str) -> None:
    """Raise ``ProfileError`` naming both models and the first field where a profile's model
    (``have``) differs from ``model`` (the ``role`` one: served, trained)."""
    want = model.fingerprint() if isinstance(model, ModelSpec) else dict(model)
    for key in sorted(set(want) | set(have.fingerprint)):
        if key == "name":
            continue
        if have.fingerprint.get(key) != want.get(key):
            raise ProfileError(
                f"{source}: profile is for model {have.name!r}, not {want.get('name', '?')!r}: "
                f"field model.fingerprint.{key} is {have.fingerprint.get(key)!r}, "
                f"the {role} model has {want.get(key)!r}"
            )


def read_validated(cls: type[M], path: str | Path, what: str = "profile") -> M:
    """Read the JSON file ``path`` into the pydantic model ``cls``; ``ProfileError`` names the
    file and the line and column (broken JSON) or the field (invalid value)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ProfileError(f"{path}: cannot read {what}: {err.strerror}") from None
    except UnicodeDecodeError as err:  # found by bench/fuzz.py: a binary file
        raise ProfileError(f"{path}: {what} is not UTF-8 text (byte {err.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ProfileError(f"{path}: line {err.lineno} column {err.colno}: not JSON: {err.msg}") from None
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "<root>"
        raise ProfileError(f"{path}: field {loc}: {first['msg']} (got {first.get('input')!r})") from None


def load_profile(path: str | Path, *, model: ModelSpec | dict | None = None) -> Profile:
    """Read and validate a profile; with ``model``, also check it describes that model."""
    profile = read_validated(Profile, path)
    if model is not None:
        check_model(profile, model, str(path))
    return profile


def save_profile(profile: BaseModel, path: str | Path) -> Path:
    """Write a profile (PTL or training) as indented JSON, creating the directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile.model_dump(mode="json"), indent=2) + "\n")
    return path


def _choose_tp(hw: Hardware, model: ModelSpec) -> int:
    for tp in (1, 2, 4, 8, 16):
        if _kv_capacity(hw, model, tp) >= MIN_KV_TOKENS:
            return tp
    raise ValueError(f"{model.name} does not fit on 16 x {hw.name} with {MIN_KV_TOKENS} tokens of KV cache")


def _kv_capacity(hw: Hardware, model: ModelSpec, tp: int) -> int:
    free = tp * hw.hbm_gb * 1e9 * MEMORY_UTILIZATION - model.weight_bytes() - tp * ACTIVATION_RESERVE_GB * 1e9
    return max(0, int(free // model.kv_bytes_per_token()))


def derive_profile(hardware: str, model_name: str, tp: int | None = None) -> Profile:
    """Roofline-derived profile of ``model_name`` on ``hardware`` (marked ``derived``)."""
    hw, model = get_hardware(hardware), get_model(model_name)
    tp = tp or _choose_tp(hw, model)
    capacity = _kv_capacity(hw, model, tp)
    if capacity < 1:
        raise ValueError(
            f"{model.name} weights ({model.weight_bytes() / 1e9:.1f} GB) leave no KV cache on {tp} x {hw.name}"
        )
    bw = tp * hw.hbm_tb_s * 1e12 * BW_EFFICIENCY
    k3 = model.decode_flops_per_token() / (tp * hw.bf16_tflops * 1e12 * FLOPS_EFFICIENCY)
    cost = StepCostFields(
        k1=1.0 / bw,
        k2=model.weight_bytes() / bw,
        k3=k3,
        k4=STEP_OVERHEAD_S + (2 * model.layers * ALLREDUCE_S if tp > 1 else 0.0),
        prefill_per_token=k3,
    )
    step = StepCost(kv_bytes_per_token=model.kv_bytes_per_token(), **cost.model_dump())
    context = 1024.0
    table = [
        PTLPoint(batch_size=bs, context_tokens=context, seconds_per_token=step.ptl(bs, context))
        for bs in (1, 2, 4, 8, 16, 32, 64, 128, 256)
    ]
    return Profile(
        hardware=hw.name, source="derived", engine="roofline",
        model=ProfileModel(name=model.name, fingerprint=model.fingerprint()),
        tensor_parallel=tp, kv_bytes_per_token=model.kv_bytes_per_token(), kv_capacity_tokens=capacity,
        max_batch=GPU_MAX_BATCH, watermark=GPU_WATERMARK, step_cost=cost, ptl=table, created=date.today().isoformat(),
        notes=(
            f"DERIVED from the {hw.name} spec sheet ({hw.source}: {hw.bf16_tflops} BF16 TFLOPS, {hw.hbm_tb_s} TB/s, "
            f"{hw.hbm_gb} GB), not measured on a GPU. Efficiencies: bandwidth {BW_EFFICIENCY}, "
            f"FLOPs {FLOPS_EFFICIENCY}; step overhead {STEP_OVERHEAD_S * 1e3:.1f} ms; PTL table evaluated at "
            f"{context:.0f} cached tokens per sequence."
        ),
    )


def shipped_profile(name: str) -> Path:
    """Path of a profile shipped in ``allocator/profiles/`` (e.g. 'H20-qwen2.5-7b')."""
    path = PROFILE_DIR / f"{name}.json"
    if not path.is_file():
        known = sorted(p.stem for p in PROFILE_DIR.glob("*.json") if not p.stem.endswith(TRAIN_SUFFIX))
        raise ProfileError(f"no shipped profile {name!r} in {PROFILE_DIR}; known: {known}")
    return path
