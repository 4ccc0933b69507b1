"""ruff over the whole repository, with the rule selection pinned in pyproject.toml.

ruff comes from the same interpreter (requirements.lock pins it), so ``make test`` and
``make lint`` agree; ``--no-cache`` keeps the check from writing into the tree.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _ruff(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *map(str, args)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_repository_is_ruff_clean():
    proc = _ruff(".")
    assert proc.returncode == 0, f"ruff check . (`make lint FIX=1` applies the safe fixes):\n{proc.stdout}{proc.stderr}"


def test_the_check_fails_on_a_violation(tmp_path):
    """The pinned selection is in force: an unused import (F), a late-bound loop variable (B) and
    unsorted imports (I) all fail, so a clean repository means something."""
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nimport os\n\nfns = []\nfor i in range(3):\n    fns.append(lambda: i)\n")
    proc = _ruff("--config", ROOT / "pyproject.toml", bad)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    for rule in ("F401", "B023", "I001"):
        assert rule in proc.stdout, (rule, proc.stdout)
