"""What this machine's CPU offers the CPU builds of torch and vLLM, said in one line.

A run on a CPU is as fast as its vector instructions let torch's and vLLM's kernels be: the same
``make run`` took 7 minutes (139 samples/s) on the 2-core AMD EPYC of the run of record (642b718,
its vector features not recorded) and 21 (52.5 samples/s) on a 2-core AMD EPYC with AVX2 and no
AVX-512 (issue 52). ``braid run`` prints this line at start and writes it into the
run's summary, so a time or a result can be read against the CPU that produced it.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

# the instruction sets that decide which kernels torch (ATen, oneDNN, MKL) and vLLM's CPU backend use
FEATURES = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")


@dataclass(frozen=True)
class CpuInfo:
    model: str
    cores: int  # usable by this process (its affinity)
    features: tuple[str, ...]  # those of FEATURES the CPU has
    torch_kernels: str  # the ATen CPU capability torch dispatches to ("AVX2", "AVX512", ...)

    @property
    def avx512(self) -> bool:
        return "avx512f" in self.features

    def line(self) -> str:
        vector = "AVX-512" if self.avx512 else ("AVX2, no AVX-512" if "avx2" in self.features else "no AVX2")
        amx = ", AMX" if "amx_tile" in self.features else ""
        return (f"CPU: {self.model}, {self.cores} core{'s' * (self.cores != 1)}, {vector}{amx}; "
                f"torch kernels {self.torch_kernels}")

    def to_json(self) -> dict:
        return {**asdict(self), "avx512": self.avx512}


def parse_cpuinfo(text: str) -> tuple[str, set[str]]:
    """(model name, flags) of the first processor in a ``/proc/cpuinfo`` text."""
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:  # x86, arm64
            flags = set(value.split())
    return model, flags


def cpu_info(cpuinfo: Path = Path("/proc/cpuinfo")) -> CpuInfo:
    try:
        model, flags = parse_cpuinfo(cpuinfo.read_text())
    except OSError:  # not Linux
        model, flags = "", set()
    try:
        import torch

        kernels = torch.backends.cpu.get_cpu_capability()
    except (ImportError, AttributeError):
        kernels = "unknown"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return CpuInfo(model or platform.processor() or platform.machine(), cores,
                   tuple(f for f in FEATURES if f in flags), kernels)
