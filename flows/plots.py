"""Matplotlib for the run report: the headless backend, and how every figure is written."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

__all__ = ["plt", "save_figure"]


def save_figure(fig, path: Path) -> None:
    """Lay ``fig`` out, write it to ``path`` (PNG, 110 dpi) and free it."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
