"""``generation.emulation``: what the emulated engine (``generation.engine: emulated``) replays.

The emulated engine (``services.generation.emulated_engine``) does no model compute: it batches
continuously as vLLM schedules, takes each step's duration from a latency profile and each
sample's output length from a recorded trace or a declared distribution. EMULATED times are
predictions, never measurements; emulation measures time, never learning. This schema is data
only: the profile and trace files are read (and their errors raised) when the engine starts.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from services.common.strict import StrictModel

MMLU_TRACE_MODEL = "Meta-Llama-3_1-8B-Instruct"  # the ranker's default target model of mmlu-pro-cot


class DeclaredLengths(StrictModel):
    """A declared output-length distribution (tokens): ``fixed`` (``tokens``), ``uniform``
    (integers in [``low``, ``high``]) or ``lognormal`` (``median`` and ``sigma`` of log-length)."""

    distribution: Literal["fixed", "uniform", "lognormal"] = Field(description="Shape of the distribution.")
    tokens: int | None = Field(None, ge=1, le=1_000_000, description="fixed: every sample's length.")
    low: int | None = Field(None, ge=1, le=1_000_000, description="uniform: shortest length.")
    high: int | None = Field(None, ge=1, le=1_000_000, description="uniform: longest length.")
    median: float | None = Field(None, gt=0, le=1_000_000, description="lognormal: median length.")
    sigma: float | None = Field(None, ge=0, le=10, description="lognormal: standard deviation of log-length.")

    @model_validator(mode="after")
    def _fields_of_the_shape(self) -> DeclaredLengths:
        need = {"fixed": ("tokens",), "uniform": ("low", "high"), "lognormal": ("median", "sigma")}[self.distribution]
        missing = [f for f in need if getattr(self, f) is None]
        fields = ("tokens", "low", "high", "median", "sigma")
        extra = [f for f in fields if f not in need and getattr(self, f) is not None]
        if missing or extra:
            raise ValueError(f"a {self.distribution} length distribution takes exactly {list(need)}; "
                             f"missing {missing}, not used {extra}")
        if self.distribution == "uniform" and self.low > self.high:  # type: ignore[operator]
            raise ValueError(f"uniform lengths: low {self.low} > high {self.high}")
        return self


class EmulationConfig(StrictModel):
    """The emulated engine's latency profile, output lengths and time scale."""

    profile: str = Field(
        min_length=1,
        description="Latency profile in the allocator's format: a shipped name in allocator/profiles/ "
        "('cpu-local-braid-tiny', 'H20-qwen2.5-7b') or a path to a .json profile (`braid profile`).",
    )
    lengths: DeclaredLengths | str = Field(
        description="Output lengths: a trace file (the mmlu-pro-cot lengths .jsonl.gz, a ranker JSONL of "
        "response_length, a generation log .sqlite, or a file of integers) or a declared distribution.",
    )
    trace_model: str = Field(
        MMLU_TRACE_MODEL, min_length=1,
        description="mmlu-pro-cot traces: whose responses (resp_chars key) give the lengths.",
    )
    chars_per_token: float = Field(
        4.0, gt=0, le=100, description="mmlu-pro-cot traces count characters: tokens = characters / this."
    )
    time_scale: float = Field(
        1.0, gt=0, le=1000,
        description="Every modelled duration is multiplied by this (0.05: a 60 s step passes in 3 s).",
    )
    instances_per_process: int = Field(
        64, ge=1, le=256,
        description="SGS instances one process serves (`python -m services.generation --instances`): the "
        "launcher starts ceil(generation.instances / this) processes, each instance on its own port. They "
        "share one interpreter (one import of torch, one RPC thread pool): 256 add ~60 MiB to one's memory "
        "(bench/sgs_multi.py). A process that dies takes all its instances down (a restart brings them back).",
    )
    reload_s: float | None = Field(
        None, ge=0, le=3600,
        description="Modelled seconds to install a weight version (None: the profile's k2, one read of the "
        "weights at HBM bandwidth: a lower bound).",
    )


class TrainerEmulationConfig(StrictModel):
    """``trainer.emulation``: what the emulated learner (``trainer.backend: emulated``) models.

    Each ``backward`` takes the time the allocator's training model (``allocator.training``)
    predicts for the micro-batches it is handed on ``gpus`` GPUs of kind ``gpu`` with the parallel
    configuration ``parallel``; ``step`` takes the per-step terms (the optimizer's fixed time, the
    data-parallel gradient exchange). Durations are scaled by ``generation.emulation.time_scale``.
    EMULATED: a prediction, never a measurement."""

    gpu: str = Field(
        "cpu-local", min_length=1,
        description="GPU kind the learner models: H800, H100, H20 (scheduling.hardware) or cpu-local (this machine's "
        "cores, timed by the measured profile allocator/profiles/cpu-local-braid-tiny-train.json).",
    )
    gpus: int = Field(1, ge=1, le=100_000, description="GPUs the modelled learner trains on.")
    gpus_per_node: int = Field(8, ge=1, le=64, description="GPUs per node (tensor parallelism stays in a node).")
    inter_node_gbps: float = Field(200.0, gt=0, le=1e5, description="Inter-node bandwidth per GPU, Gbit/s.")
    model: str | None = Field(
        None, min_length=1,
        description="Declared model whose FLOPs and weights are modelled: a name in "
        "services/generation/scheduling/models.py (qwen2.5-7b, qwen2.5-32b, qwen2.5-72b, braid-tiny); None = the "
        "run's own checkpoint (its config.json).",
    )
    train_profile: str | None = Field(
        None, min_length=1,
        description="Step-time profile (`braid profile-train`) path, or 'roofline'; None = the shipped profile of "
        "gpu x model x algorithm when there is one, else the roofline (MFU 0.40).",
    )
    parallel: str = Field(
        "auto", pattern=r"^(auto|dp\d+-tp\d+-pp\d+)$",
        description="Parallel configuration 'dpD-tpT-ppP' (D x T x P = gpus), or auto: the allocator's fastest that "
        "fits in memory for an iteration of max_new_tokens-long responses.",
    )
