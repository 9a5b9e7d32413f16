#!/usr/bin/env bash
# The GPU work of a session in one command: install the wheels the GPU image lacks (fetched by
# ../shared/tools/gpu-wheels.sh platformdirs==4.14.9 into .whl/), run the GPU tests, then the benchmark; logs under
# $OUT (or ./gpu-out), a short table last.
# Usage: scripts/gpu_check.sh [tests|tests-a|tests-b|ops|models|startup|fp8|bench|bert|encoder|decode|families|tune|probe|fuzz|ab|all] [extra args...]
#   tests: every GPU test (over 10 minutes since session 15: one device call runs tests-a, the
#   files up to test_models_gpu.py, another tests-b, the rest); ops/models/startup: one file's worth (startup: tuning, start-up
#   decisions, CLI); fp8: the fp8 GPT blocks against fp16 (tests/gpu/test_fp8_gpu.py); bench: resnet50 vs PyTorch; tune: scripts/bench_tune.py (tuning tables, cold
#   start, tuned benchmarks); encoder: the cuBLASLt and few-row matmul GPU tests, then the 12-layer
#   encoder (B=8, S=576) tuned with `dslc tune --fusion measure` against PyTorch with --kernels;
#   bert: dslc bench of the BERT front (B=8, S=128) against PyTorch,
#   untuned and tuned (`dslc tune --fusion measure`), JSON reports for scripts/bench_docs.py; decode: scripts/bench_decode.py (the 16-layer decoder a token
#   against PyTorch; extra args go to it, e.g. --kernels); probe: scripts/probe_gpu.py (where
#   the time goes); fuzz:
#   scripts/fuzz_diff.py --backend cudnn (FUZZ_COUNT programs of FUZZ_SEED over FUZZ_JOBS
#   processes; extra args go to it); families: scripts/bench_families.py (the model
#   families against PyTorch and torch.compile; extra args go to it, e.g. --untuned or --only
#   convnext); ab: dslc bench of one model on this tree and on BASE's (below); all: tests, then tune.
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
shift || true
out=${OUT:-gpu-out}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
  > "$out/pip.log" 2>&1 || { cat "$out/pip.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# The GPU image lacks some of dslc's dependencies (platformdirs since the plan cache): say which,
# before every test fails on it.
python3 -c "import lark, platformdirs, filelock, cudnn, cupy, ml_dtypes, msgpack, safetensors" \
  || { echo "a dependency is missing on this machine: fetch its wheel into .whl/ (README)"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
status=0
run_tests() {  # name, then test files
  local name=$1; shift
  python3 -m pytest "$@" -m gpu -q -s -rA -p no:cacheprovider "${extra[@]}" 2>&1 | tee "$out/gpu_$name.log" \
    | grep -E "compiled|calibrated|relative error|fp8 GPU|fresh process|heuristic|restore|replay|retime|retune|no bucket|PASSED|FAILED|ERROR|passed|failed|Error" \
    | tail -60
  grep -qE "[0-9]+ passed" "$out/gpu_$name.log" && ! grep -qE "[0-9]+ (failed|error)" "$out/gpu_$name.log" || status=1
}
extra=("$@")
case $what in
  ops) run_tests ops tests/gpu/test_ops_gpu.py ;;
  models) run_tests models tests/gpu/test_models_gpu.py ;;
  fp8) run_tests fp8 tests/gpu/test_fp8_gpu.py ;;
  encoder) run_tests blas tests/gpu/test_blas_gpu.py tests/gpu/test_gemv_gpu.py ;;
  startup) run_tests startup tests/gpu/test_tune_gpu.py tests/gpu/test_cli_gpu.py ;;
  tests|all) run_tests all tests/gpu ;;
  tests-a) run_tests a $(ls tests/gpu/test_*.py | awk '$0 <= "tests/gpu/test_models_gpu.py"') ;;
  tests-b) run_tests b $(ls tests/gpu/test_*.py | awk '$0 > "tests/gpu/test_models_gpu.py"') ;;
esac
case $what in
  bench)
    python3 scripts/bench_gpu.py --out "$out/bench.json" 2>&1 | tee "$out/bench.log" | tail -12 || status=1 ;;
  bert)
    python3 -m dslc bench models/bert.cgraph --size B=8,S=128 --against torch --format json \
      --plot "$out/bert.png" > "$out/bert.json" 2> "$out/bert.log" || status=1
    python3 -m dslc compile models/bert.cgraph -o "$out/bert" --target device --bucket B=8,S=128 \
      --no-tune -q && python3 -m dslc weights random models/bert.cgraph -o "$out/bert/w.safetensors" \
      && python3 -m dslc tune "$out/bert/bert_base_front.bundle" --fusion measure \
      -o "$out/bert/tuned.bundle" -q > "$out/bert_tune.log" 2>&1 \
      && python3 -m dslc bench "$out/bert/tuned.bundle" --weights "$out/bert/w.safetensors" \
      --size B=8,S=128 --against torch --format json > "$out/bert_tuned.json" 2>> "$out/bert.log" \
      || status=1
    for r in "$out/bert.json" "$out/bert_tuned.json"; do
      python3 -c "import json, sys; d = json.load(open(sys.argv[1]))['sizes'][0]; o, t = d['dslc'], d['torch']
print(sys.argv[1], 'dslc graph %.4f call %.4f | torch.compile %.4f | x compile %.2f' % (o['graph_ms'],
      o['graph_call_ms'], t['compile_ms'], t['compile_ms'] / o['graph_ms']))" "$r" || status=1
    done ;;
  decode)
    python3 scripts/bench_decode.py --layers 16 --position 1000 --repeats 50 --steps 3 \
      --out "$out/decode.json" "${extra[@]}" > "$out/decode.log" 2>&1 || status=1
    grep -E "joined with|^\| 16|relative error" "$out/decode.log" | tail -8 ;;
  encoder)  # the 12-layer encoder tuned with its fusion choices (matmuls on cuBLASLt), against PyTorch
    e="$out/encoder"; mkdir -p "$e"
    python3 -m dslc compile models/encoder.cgraph -o "$e" --target device --bucket B=8,S=576 -q \
      && python3 -m dslc weights random models/encoder.cgraph -o "$e/w.safetensors" \
      && python3 -m dslc tune "$e/vit_b_encoder.bundle" --fusion measure -o "$e/t.bundle" -q \
      > "$e/tune.log" 2>&1 \
      && python3 -m dslc bench "$e/t.bundle" --weights "$e/w.safetensors" --size B=8,S=576 \
      --against torch --kernels --repeats 20 > "$e/bench.txt" 2> "$e/bench.log" || status=1
    head -4 "$e/bench.txt"; grep -A9 "kernels of one dslc" "$e/bench.txt" ;;
  families)
    python3 scripts/bench_families.py --out "$out" "${extra[@]}" > "$out/families.log" 2>&1 || status=1
    tail -12 "$out/families.log" ;;
  ab)  # dslc bench of one model on this tree and on BASE (another tree's dslc/ and grammar/, e.g. `git
       # archive REV dslc grammar | tar -x -C build/base`, carried), each with an empty plan cache;
       # extra args: the .cgraph file, then bench's, e.g. models/unet.cgraph --size N=1,H=256,W=256
    base=${BASE:-build/base}
    [ -d "$base/dslc" ] && [ -d "$base/grammar" ] || { echo "ab: no dslc/ and grammar/ under $base (carry it)"; exit 1; }
    root=$PWD
    for side in new base; do
      tree=$root; [ $side = base ] && tree=$root/$base
      rm -rf ~/.cache/dslc
      (cd "$tree" && PYTHONPATH=/tmp/site:$tree python3 -m dslc bench "$root/${extra[0]}" \
        "${extra[@]:1}" --format json > "$out/ab_$side.json" 2> "$out/ab_$side.log") || status=1
      python3 -c "import json, sys; d = json.load(open(sys.argv[1]))
for s in d['sizes']:
    steps = (s['roofline'] or {}).get('steps') or []
    print(sys.argv[2], s['dims'], 'graph %.4f plain %.4f ms' % (s['dslc']['graph_ms'], s['dslc']['plain_ms']))
    print('   ', ' | '.join('%s %.4f' % (r['step'], r['ms']) for r in steps[:8]))" "$out/ab_$side.json" $side \
        || status=1
    done ;;
  probe)
    python3 scripts/probe_gpu.py --out "$out" 2>&1 | tee "$out/probe.log" | tail -80 || status=1 ;;
  fuzz)
    python3 scripts/fuzz_diff.py --backend cudnn --count "${FUZZ_COUNT:-500}" --seed "${FUZZ_SEED:-1}" \
      --jobs "${FUZZ_JOBS:-8}" "${extra[@]}" > "$out/fuzz.log" 2>&1 || status=1
    grep -E "^FAIL|rerun:|programs \(seed" "$out/fuzz.log" | tail -60 ;;
  tune|all)
    python3 scripts/bench_tune.py --out "$out" > "$out/bench_tune.log" 2>&1 || status=1
    sed -n '/^== summary/,$p' "$out/bench_tune.log" ;;
esac
exit $status
