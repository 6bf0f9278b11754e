#!/bin/bash
# Issue 15, the FP8 GEMM at decode sizes (the `fp8_gemm` engine option), in one device call on one H200 (~7 min):
#   1. the FP8 layer and kernel tests on the GPU (each tensor-core GEMM against the reference and replayed from
#      a CUDA graph, the scales pass bit for bit against torch, the Triton GEMM autotuned);
#   2. the GEMM sweep: qwen2-7b qkv / o / gate_up / down at 16 ... 16,384 rows, bf16 against FP8 row-wise,
#      unscaled cuBLASLt + scales pass, the Triton GEMM, their fast-accumulation and per-tensor relatives, and
#      which kernels each ran (gemm_sweep.json);
#   3. `bench throughput`, issue-7 workload (256 prompts 100-1024 -> 256, budget 16,384), qwen2-7b shape: bf16, FP8
#      with the row-wise GEMM everywhere (the code before fp8_gemm, and auto's default), FP8 with cuBLASLt everywhere
#      (--fp8-gemm cublaslt, new), cuBLASLt + FP8 KV; the sweep's cublaslt_faster_at_m then sets
#      layers/fp8.py's CUBLASLT_MAX_TOKENS (auto's threshold, 0 until measured);
#   4. one decode step of 256 rows under torch.profiler, bf16 / FP8 row-wise / FP8 cuBLASLt (profile.txt);
#   5. if time is left, `bench throughput` with the Triton FP8 GEMM everywhere (--fp8-gemm triton).
# Each step runs under `timeout` and none starts once BUDGET_S (default 450 s) is spent. Outputs, 7 files:
# $OUT/log.txt (summary last), tests.txt, sweep.log, gemm_sweep.json, benches.json, bench_logs.txt, profile.txt.
# DRY_RUN=1: the same steps on the CPU with small shapes and the embedded tiny model (a check of this script).
set -o pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
export OUT=${OUT:-/tmp/fp8-gemm-out}
BUDGET_S=${BUDGET_S:-450}
. scripts/gpu/steps.sh  # log, step (under the budget), header, bench, the carried wheels
header

tests() {
  python3 -m pytest -q -p no:cacheprovider tests/engine/runner/layers/test_fp8.py tests/engine/runner/attention/test_fp8_kernels.py \
    > "$OUT/tests.txt" 2>&1
  local rc=$?
  tail -n 8 "$OUT/tests.txt" | tee -a "$OUT/log.txt"
  return $rc
}
export -f tests
step tests 90 tests

step "gemm sweep" 150 bash -c 'python3 scripts/gpu/fp8_gemm.py sweep > "$OUT/sweep.log" 2>&1; rc=$?; tail -n 4 "$OUT/sweep.log"; exit $rc'
FP8_PEAK=$(python3 -c "import json; print(json.load(open('$OUT/gemm_sweep.json'))['fp8_peak_for_roofline'] or '')" 2>/dev/null)
log "   fp8 peak for the roofline: ${FP8_PEAK:-default (2x bf16)}"

if [ -n "$DRY_RUN" ]; then
  WORKLOAD="--device cpu --num-prompts 8 --input-len 16-64 --output-len 8 --warmup-prompts 2"
  ROWWISE=""  # a named tensor-core GEMM is refused on the CPU: the dry run runs auto (the reference path) for all
  CUBLASLT=""
  TRITON=""
else
  WORKLOAD="--model qwen2-7b --num-prompts 256 --input-len 100-1024 --output-len 256 --max-num-batched-tokens 16384"
  WORKLOAD="$WORKLOAD ${FP8_PEAK:+--fp8-peak-tflops $FP8_PEAK}"
  ROWWISE="--fp8-gemm rowwise"
  CUBLASLT="--fp8-gemm cublaslt"
  TRITON="--fp8-gemm triton"
fi
export WORKLOAD
step "bench bf16" 95 bench bf16
step "bench fp8 rowwise (before)" 95 bench fp8-rowwise --quantization fp8 $ROWWISE
step "bench fp8 cublaslt (new)" 95 bench fp8-cublaslt --quantization fp8 $CUBLASLT
step "bench fp8 cublaslt + fp8 kv" 95 bench fp8-cublaslt-kv --quantization fp8 --kv-cache-dtype fp8 $CUBLASLT
python3 scripts/gpu/fp8_gemm.py benches "$BENCH_TMP"

: > "$OUT/profile.txt"
if [ -n "$DRY_RUN" ]; then PROFILES="bf16 fp8-auto"; else PROFILES="bf16 fp8-rowwise fp8-cublaslt"; fi
for v in $PROFILES; do
  step "profile $v" 60 bash -c "python3 scripts/gpu/fp8_gemm.py profile $v > \"$BENCH_TMP/profile-$v.log\" 2>&1; rc=\$?; tail -n 2 \"$BENCH_TMP/profile-$v.log\"; exit \$rc"
  { echo "## profile $v"; tail -n 12 "$BENCH_TMP/profile-$v.log" 2>/dev/null; } >> "$OUT/bench_logs.txt"
done

# Last, if time is left: the engine with the Triton GEMM everywhere (a candidate; auto does not take it).
step "bench fp8 triton" 95 bench fp8-triton --quantization fp8 $TRITON
python3 scripts/gpu/fp8_gemm.py benches "$BENCH_TMP"

log "== summary ($(( $(date +%s) - T0 ))s)"
python3 scripts/gpu/fp8_gemm.py summary 2>&1 | tee -a "$OUT/log.txt"
