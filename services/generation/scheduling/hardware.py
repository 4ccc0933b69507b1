"""Accelerator specifications for roofline-derived profiles.

H20 and H800 are StreamRL Table 1 (BF16 dense TFLOPS, HBM capacity and bandwidth, relative
cost per machine). H100 is NVIDIA's H100 SXM5 data sheet (989.4 dense BF16 TFLOPS — 1979 is
with sparsity —, 80 GB HBM3 at 3.35 TB/s); StreamRL gives it no cost, so ``cost`` is None.
``cpu-local`` has no roofline: its profile is measured (``braid profile``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    name: str
    bf16_tflops: float
    hbm_gb: float
    hbm_tb_s: float
    nvlink_gb_s: float
    cost: float | None  # relative cost per machine (StreamRL Table 1: H20 = 1.00)
    source: str


HARDWARE: dict[str, Hardware] = {
    "H20": Hardware("H20", 148.0, 96.0, 4.0, 900.0, 1.00, "StreamRL Table 1"),
    "H800": Hardware("H800", 989.5, 80.0, 3.35, 400.0, 2.85, "StreamRL Table 1"),
    "H100": Hardware("H100", 989.4, 80.0, 3.35, 900.0, None, "NVIDIA H100 SXM5 data sheet"),
}


def get_hardware(name: str) -> Hardware:
    try:
        return HARDWARE[name]
    except KeyError:
        raise ValueError(f"unknown GPU kind {name!r}; known: {sorted(HARDWARE)}") from None
