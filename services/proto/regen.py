"""Regenerate the checked-in gRPC stubs from braid.proto (``make proto``).

``python -m services.proto.regen --check`` exits 1 if the checked-in stubs differ from a fresh
generation (used by the test suite)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
STUBS = ("braid_pb2.py", "braid_pb2_grpc.py", "braid_pb2.pyi")


def generate(out_dir: Path) -> None:
    from grpc_tools import protoc

    args = [
        "protoc",
        f"-I{ROOT}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(HERE.relative_to(ROOT) / "braid.proto"),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        fresh = Path(tmp) / HERE.relative_to(ROOT)
        stale = [n for n in STUBS if (fresh / n).read_text() != ((HERE / n).read_text() if (HERE / n).exists() else "")]
        if ns.check:
            if stale:
                print(f"stale stubs: {', '.join(stale)}; run `make proto`", file=sys.stderr)
                return 1
            return 0
        for name in STUBS:
            (HERE / name).write_text((fresh / name).read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
