#!/usr/bin/env bash
# The lent GPU machine's checks in one run (docs/gpu.md): the CUDA suite (tests/gpu), then
# bench/gpu_train.py. Run from the repository root with .whl/ (make gpu-wheels) beside it; logs and
# results go to $OUT (the device tool's folder; /tmp/braid-gpu elsewhere). Each part has its own
# time limit, so a hang in one still leaves the other's results.
set -u
OUT=${OUT:-/tmp/braid-gpu}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "installing .whl/ failed (run make gpu-wheels here first)"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ nvidia-smi; python3 -c "import sys, torch, transformers; print(sys.version); print('torch', torch.__version__, 'transformers', transformers.__version__)"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
timeout "${GPU_TEST_TIMEOUT:-240}" python3 -m pytest -q -m gpu -rs -p no:cacheprovider tests/gpu \
  --junitxml="$OUT/gpu-junit.xml" 2>&1 | tee "$OUT/gpu-tests.log"
tests_rc=${PIPESTATUS[0]}
timeout "${GPU_BENCH_TIMEOUT:-240}" python3 bench/gpu_train.py --out "$OUT" ${GPU_BENCH_ARGS:-} 2>&1 | tee "$OUT/gpu-bench.log"
bench_rc=${PIPESTATUS[0]}
echo "gpu tests rc=$tests_rc, gpu bench rc=$bench_rc"
exit $((tests_rc != 0 || bench_rc != 0))
