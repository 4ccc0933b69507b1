"""Terminal progress settings shared by long phases."""

from __future__ import annotations

import sys


def progress_interval() -> float:
    """Seconds between progress-bar refreshes: live on a terminal, sparse in a log file."""
    return 0.5 if sys.stderr.isatty() else 20.0
