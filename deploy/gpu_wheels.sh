#!/usr/bin/env bash
# Wheels the lent GPU machine lacks (no network there; Python 3.12 with its own CUDA torch and
# transformers), at the versions of requirements.lock, into .whl/ (git-ignored): the device tool
# carries the folder and the suite installs it into /tmp/site first. See docs/gpu.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES=(pydantic pydantic_core annotated-types typing-inspection megatron-core protobuf grpcio)
# .whl/ is in .gitignore: the device tool carries it only when a run names it
rm -rf .whl && mkdir -p .whl
pins=()
for name in "${PACKAGES[@]}"; do
  pin=$(grep -i -E "^${name//[-_]/[-_]}==" requirements.lock) || { echo "requirements.lock has no pin for $name" >&2; exit 1; }
  pins+=("$pin")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any -d .whl "${pins[@]}"
du -sh .whl
