"""Cluster and workload files of ``braid allocate`` (pydantic; errors name the file and field).

Cluster file (``deploy/clusters/*.yaml``)::

    name: cross-site-32xH20-128xH800
    sites:
      - name: h20-cloud
        gpu: H20                 # a kind of scheduling.hardware, or a custom one with tflops + memory_gb
        count: 32
        gpus_per_node: 8
        inter_node_gbps: 100     # per GPU
        roles: [generation]
      - name: h800-dc
        gpu: H800
        count: 128
        roles: [training]
    links:
      - {sites: [h20-cloud, h800-dc], gbps: 80}

``count: auto`` (and ``gpus_per_node: auto``) is the number of CPU cores this process may run on
(``os.sched_getaffinity``), read when the file is loaded: a CPU site where one "GPU" is one core
(``local-cpu.yaml``) then describes the machine that plans and runs.

A site may name a generation ``profile`` (PTL JSON, ``braid profile``) and, on the training site,
a ``train_profile`` (step-time JSON, ``braid profile-train``) that replaces the training roofline;
without one, a shipped profile of the site's kind, the model, the workload's algorithm and the
site's ``train_backend`` (default torch) is used when ``allocator/profiles/`` has one, else the
roofline; ``train_profile: roofline`` asks for the roofline.

One site with both roles = single-site planning (x + y <= count); a generation site and a
training site = two-site planning (x <= m, y <= n). ``cost_per_gpu`` defaults to the kind's
StreamRL Table 1 cost (H20 = 1.00, H800 = 2.85); kinds without one (H100, custom) must set it.

Workload file (``deploy/workloads/*.yaml``): ``batch_size`` samples per iteration, and prompt
and response lengths either as ``samples`` (token counts; drawn with replacement, seeded, when
there are not exactly ``batch_size`` of them) or as a capped ``lognormal`` (median, sigma, min,
max); the RL ``algorithm`` (grpo | ppo, sets the training passes) and the SGS ``dispatch`` and
``admission`` policies the generation-time simulation runs.
"""

from __future__ import annotations

import math
import os
import random
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from services.common.config import ConfigError, StrictModel, load_model


class AllocationInputError(ValueError):
    """Planning input is missing or inconsistent; the message says what (file, field, numbers)."""


def machine_cores() -> int:
    """CPU cores this process may run on (its affinity mask; all online cores where there is none)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _auto_cores(value: Any) -> Any:
    return machine_cores() if value == "auto" else value


CoreCount = Annotated[int, BeforeValidator(_auto_cores)]


class SiteSpec(StrictModel):
    """One site of a cluster: a pool of identical GPUs."""

    name: str = Field(min_length=1, description="Site name.")
    gpu: str = Field(min_length=1, description="GPU kind: H20, H800, H100 (scheduling.hardware) or a custom kind.")
    count: CoreCount = Field(ge=1, le=1_000_000, description="GPUs at the site available to this job; 'auto' = the "
                             "CPU cores this process may run on (a CPU site, one core per 'GPU').")
    gpus_per_node: CoreCount = Field(8, ge=1, le=64, description="GPUs per node (tensor parallelism stays inside a "
                                     "node); 'auto' = this machine's CPU cores, as count.")
    inter_node_gbps: float = Field(200.0, gt=0, le=1e5, description="Inter-node network bandwidth per GPU, Gbit/s.")
    cost_per_gpu: float | None = Field(None, gt=0, le=1e6, description="Relative cost per GPU (default: the kind's "
                                       "StreamRL Table 1 cost).")
    roles: list[Literal["generation", "training"]] = Field(min_length=1, description="Stages this site may run.")
    tflops: float | None = Field(None, gt=0, le=1e6, description="Custom kind: dense BF16 (or fp32 for a CPU) TFLOPS.")
    memory_gb: float | None = Field(None, gt=0, le=1e5, description="Custom kind: memory per GPU (device), GB.")
    memory_tb_s: float | None = Field(None, gt=0, le=1e3, description="Custom kind: memory bandwidth, TB/s.")
    profile: str | None = Field(None, description="PTL profile JSON of this kind x model (default: shipped, else "
                                "derived).")
    train_profile: str | None = Field(
        None, description="Training step-time profile JSON of this kind x model (`braid profile-train`), or "
        "'roofline'; training site only; default: the shipped profile of this kind, model, algorithm and "
        "train_backend when there is one, else the roofline (MFU 0.40).")
    train_backend: Literal["torch", "megatron"] = Field(
        "torch", description="trainer.backend the site trains with (picks the measured profile).")
    allocation_step: Literal["node", "instance"] | None = Field(
        None, description="GPUs move between the stages by whole nodes or by single instances "
        "(default: node on multi-node sites, instance otherwise).")


class LinkSpec(StrictModel):
    sites: list[str] = Field(min_length=2, max_length=2, description="The two sites the link connects.")
    gbps: float = Field(gt=0, le=1e6, description="Dedicated link bandwidth, Gbit/s.")


class ClusterSpec(StrictModel):
    """A cluster file: sites, GPU kinds, counts, interconnect, costs."""

    name: str = Field(min_length=1, description="Cluster name.")
    description: str = Field("", description="Free text.")
    sites: list[SiteSpec] = Field(min_length=1, max_length=2,
                                  description="One site (both stages) or two (one per stage).")
    links: list[LinkSpec] = Field(default_factory=list, description="Inter-site links.")

    @model_validator(mode="after")
    def _roles(self) -> ClusterSpec:
        if len(self.sites) == 1 and set(self.sites[0].roles) != {"generation", "training"}:
            raise ValueError(f"a single site must have roles [generation, training], got {self.sites[0].roles}")
        if len(self.sites) == 2:
            roles = sorted(r for s in self.sites for r in s.roles)
            if roles != ["generation", "training"]:
                raise ValueError(
                    f"two sites need one generation and one training role, got {[s.roles for s in self.sites]}"
                )
        for site in self.sites:
            if site.train_profile is not None and "training" not in site.roles:
                raise ValueError(
                    f"site {site.name!r}: train_profile is set but the site has no training role ({site.roles})"
                )
        names = {s.name for s in self.sites}
        for link in self.links:
            if not set(link.sites) <= names:
                raise ValueError(f"link {link.sites} names a site not in {sorted(names)}")
        return self

    def site(self, role: str) -> SiteSpec:
        return next(s for s in self.sites if role in s.roles)


class LognormalSpec(StrictModel):
    median: float = Field(gt=0, le=1e7, description="Median tokens.")
    sigma: float = Field(ge=0, le=5, description="Log-space standard deviation (tail weight).")
    min: int = Field(1, ge=1, le=10_000_000, description="Shortest length, tokens.")
    max: int = Field(ge=1, le=10_000_000, description="Cap, tokens (the dataset's maximum length).")


class LengthSpec(StrictModel):
    samples: list[int] | None = Field(None, min_length=1, description="Token counts (drawn with replacement).")
    lognormal: LognormalSpec | None = Field(None, description="A capped lognormal distribution instead of samples.")

    @model_validator(mode="after")
    def _one(self) -> LengthSpec:
        if (self.samples is None) == (self.lognormal is None):
            raise ValueError("give exactly one of samples or lognormal")
        if self.samples is not None and min(self.samples) < 1:
            raise ValueError(f"samples must be >= 1 token, got {min(self.samples)}")
        return self


class WorkloadSpec(StrictModel):
    """A workload file: what one RL iteration generates and trains on."""

    name: str = Field(min_length=1, description="Workload name.")
    description: str = Field("", description="Free text.")
    batch_size: int = Field(ge=1, le=1_000_000, description="Samples generated and trained on per iteration.")
    prompt_tokens: LengthSpec = Field(description="Prompt lengths, tokens.")
    response_tokens: LengthSpec = Field(description="Response (output) lengths, tokens.")
    algorithm: Literal["grpo", "ppo"] = Field("grpo",
                                              description="grpo: policy + reference; ppo: actor, critic, reference.")
    dispatch: str = Field("lpt", description="SGS dispatch policy simulated (services.generation.scheduling).")
    admission: Literal["fcfs", "lpt"] = Field("lpt", description="Admission order inside each instance.")
    seed: int = Field(0, ge=0, description="Seed of the length draws.")


def load_input(cls, path: str | Path, what: str):
    """Load a planning input file into ``cls``; ``AllocationInputError`` names the file and field."""
    path = Path(path)
    if not path.is_file():
        raise AllocationInputError(f"{path}: no such {what} file")
    try:
        return load_model(cls, path)
    except ConfigError as err:
        raise AllocationInputError(str(err).replace("invalid config", f"invalid {what} file", 1)) from None


def load_cluster(path: str | Path) -> ClusterSpec:
    return load_input(ClusterSpec, path, "cluster")


def load_workload(path: str | Path) -> WorkloadSpec:
    return load_input(WorkloadSpec, path, "workload")


def draw(spec: LengthSpec, n: int, rng: random.Random) -> list[int]:
    """``n`` lengths from ``spec`` (samples as they are when there are exactly ``n``)."""
    if spec.samples is not None:
        if len(spec.samples) == n:
            return list(spec.samples)
        return [rng.choice(spec.samples) for _ in range(n)]
    ln = spec.lognormal
    assert ln is not None
    mu = math.log(ln.median)
    return [min(ln.max, max(ln.min, round(rng.lognormvariate(mu, ln.sigma)))) for _ in range(n)]


def workload_lengths(wl: WorkloadSpec) -> tuple[list[int], list[int]]:
    """(prompt tokens, response tokens) of one iteration's ``batch_size`` samples."""
    rng = random.Random(wl.seed)
    return draw(wl.prompt_tokens, wl.batch_size, rng), draw(wl.response_tokens, wl.batch_size, rng)
