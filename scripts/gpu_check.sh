#!/usr/bin/env bash
# The GPU work of a session in one command: install the wheels the GPU image lacks (fetched by
# ../shared/tools/gpu-wheels.sh into .whl/), run the GPU tests, then the benchmark; logs under
# $OUT (or ./gpu-out), a short table last.
# Usage: scripts/gpu_check.sh [tests|ops|models|bench|all] [extra pytest args...]
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
shift || true
out=${OUT:-gpu-out}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
  > "$out/pip.log" 2>&1 || { cat "$out/pip.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
status=0
case $what in
  ops|tests|all)
    python3 -m pytest tests/gpu/test_ops_gpu.py -m gpu -q -rA -p no:cacheprovider "$@" \
      2>&1 | tee "$out/gpu_ops.log" | tail -40 || status=1 ;;
esac
case $what in
  models|tests|all)
    python3 -m pytest tests/gpu/test_models_gpu.py -m gpu -q -s -rA -p no:cacheprovider "$@" \
      2>&1 | tee "$out/gpu_models.log" | grep -E "compiled|relative error|fresh process|passed|failed|Error|error" | tail -40 || status=1 ;;
esac
case $what in
  bench|all)
    python3 scripts/bench_gpu.py --out "$out/bench.json" 2>&1 | tee "$out/bench.log" | tail -12 || status=1 ;;
esac
exit $status
