import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_checked_in_stubs_match_the_proto():
    proc = subprocess.run([sys.executable, "-m", "services.proto.regen", "--check"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
