#!/bin/bash
# FP8 against bf16 in one device call on one H200 (~7 min, BUDGET_S default 420 s): the FP8 table of BENCHMARKS.md.
#   1. the GPU tests ($TESTS) of the FP8 kernels and GEMMs (every tensor-core GEMM choice against the reference and
#      from a CUDA graph, the fused norm / SiLU-and-mul quantization, attention over an FP8 cache);
#   2. the SiLU-and-mul quantization kernels alone (silu_quant_bench.py: bf16 kernel, two-pass, one-pass by warps;
#      each output checked bit for bit);
#   2b. the paged decode kernel over an FP8 cache at the workload's mid-run contexts, launch configurations swept
#      (tune_decode.py fp8: its 64-token tiles are half the bytes of a bf16 cache's per loop iteration);
#   3. `bench throughput`, issue-7 workload (256 prompts 100-1024 -> 256, budget 16,384), qwen2-7b shape,
#      interleaved: bf16, FP8 weights + FP8 KV, FP8 weights, then
#      the same again (FP8 through auto); then the
#      qwen3-0.6b shape: bf16, FP8 weights, FP8 weights + FP8 KV;
#   4. profile_steps.py over the 7B FP8 + FP8 KV run (steps with prefill vs pure decode, host parts, kernel tables).
# Each step runs under `timeout`; none starts once BUDGET_S is spent. Outputs in $OUT: log.txt (summary last),
# tests.txt, silu_quant.json, tune_decode_fp8.json, benches.json, bench_logs.txt, profile_qwen2-7b_fp8_fp8.{txt,json}
# (8 files: a device call returns at most 8, so nothing else may go to $OUT). Accuracy is not rerun: the one-pass kernel's output is the two-pass kernel's,
# bit for bit (step 2 and the kernel tests check it), and the GEMM choices are those the fifth run checked.
# BENCH_ONLY=1: the tests and the benches only (no kernel bench, decode sweep or profile: 4 files in $OUT).
# SILU=0: no SiLU-and-mul kernel bench; PROFILE=0: no profile; SMALL=0: no qwen3-0.6b benches; ROUNDS=1: the 7B
# variants once (default 2, interleaved: bf16 and FP8 + FP8 KV again); WEIGHTS_ONLY=0: no FP8-weights-only 7B
# variant; ACCURACY=1: fp8_check.py
# accuracy after the benches (fp8_accuracy.json; ACCURACY_PARTS picks its comparisons); TUNE=0: no decode sweep;
# TESTS_S: the tests' time limit (default 75 s).
# DRY_RUN=1: the same 7B steps on the CPU with the embedded tiny model and auto (a check of this script).
set -o pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
export OUT=${OUT:-/tmp/fp8-speed-out}
BUDGET_S=${BUDGET_S:-420}
. scripts/device/steps.sh  # log, step (under the budget), header, bench, the carried wheels
header

# TESTS: the GPU tests to run first (default: the FP8 kernels' and GEMMs' three files; TESTS=tests/engine/runner/layers/test_fp8.py
# for the GEMM choices alone).
TESTS=${TESTS:-"tests/engine/runner/attention/test_fused_fp8_kernels.py tests/engine/runner/layers/test_fp8.py tests/engine/runner/attention/test_fp8_kernels.py tests/engine/runner/attention/test_kv_layout.py"}
export TESTS
tests() {
  python3 -m pytest -q -p no:cacheprovider $TESTS > "$OUT/tests.txt" 2>&1
  local rc=$?
  tail -n 6 "$OUT/tests.txt" | tee -a "$OUT/log.txt"
  return $rc
}
export -f tests
step tests ${TESTS_S:-75} tests
[ -z "$DRY_RUN$BENCH_ONLY" ] && [ "${SILU:-1}" != 0 ] && step "SiLU-and-mul quantization kernels" 60 \
  bash -c 'set -o pipefail; python3 scripts/dev/silu_quant_bench.py | tail -n 1 > /dev/null'
[ -z "$DRY_RUN$BENCH_ONLY" ] && [ "${TUNE:-1}" != 0 ] && step "decode attention over an FP8 cache: launch configurations" 100 \
  bash -c 'set -o pipefail; python3 scripts/dev/tune_decode.py fp8 2>&1 | grep -v "^ best" | tail -n 4'

if [ -n "$DRY_RUN" ]; then
  WORKLOAD="--device cpu --num-prompts 8 --input-len 16-64 --output-len 8 --warmup-prompts 2"
  AUTO=""; FAST=""  # a named tensor-core GEMM is refused on the CPU: the dry run runs auto (the reference path)
else
  WORKLOAD="--model qwen2-7b --num-prompts 256 --input-len 100-1024 --output-len 256 --max-num-batched-tokens 16384"
  WORKLOAD="$WORKLOAD --fp8-peak-tflops 1339.2"  # the FP8 roofline rate the H200 sweep measured (fp8_gemm.py sweep)
  AUTO="--fp8-gemm auto"; FAST="--fp8-gemm rowwise-fast"
fi
export WORKLOAD
# Interleaved, each variant twice: the 7B bf16 run spreads by a few percent between calls, and a ratio near the
# line needs the spread beside it. auto is rowwise-fast except for decode-sized GEMMs the row-wise kernel would not
# spread over the GPU (layers/fp8.py). Then the qwen3-0.6b shape once each, both shapes side by side in one call.
ROUND_NAMES=""; [ "${ROUNDS:-2}" = 1 ] || ROUND_NAMES="-again"
for round in "" $ROUND_NAMES; do
  step "bench bf16$round" 45 bench bf16$round
  step "bench fp8 auto + fp8 kv$round" 45 bench fp8-auto-kv$round --quantization fp8 --kv-cache-dtype fp8 $AUTO
  [ -z "$round" ] && [ "${WEIGHTS_ONLY:-1}" != 0 ] && step "bench fp8 auto$round" 40 bench fp8-auto$round --quantization fp8 $AUTO
done
if [ -z "$DRY_RUN" ] && [ "${SMALL:-1}" != 0 ]; then
  step "bench 0.6b bf16" 35 bench 0.6b-bf16 --model qwen3-0.6b
  step "bench 0.6b fp8 auto" 35 bench 0.6b-fp8-auto --model qwen3-0.6b --quantization fp8 $AUTO
  step "bench 0.6b fp8 auto + fp8 kv" 35 bench 0.6b-fp8-auto-kv --model qwen3-0.6b --quantization fp8 --kv-cache-dtype fp8 $AUTO
fi
python3 scripts/bench/fp8_gemm.py benches "$BENCH_TMP"

# ACCURACY=1: fp8_check.py accuracy (qwen2-7b shape: prefill, and teacher-forced decode with FP8 and float16 dots)
# -> $OUT/fp8_accuracy.json.
if [ -z "$DRY_RUN$BENCH_ONLY" ] && [ "${ACCURACY:-0}" != 0 ]; then
  step "accuracy qwen2-7b (prefill and decode)" 150 bash -c 'set -o pipefail; python3 scripts/bench/fp8_check.py accuracy \
    > /tmp/fp8_accuracy.log 2>&1 || { tail -n 5 /tmp/fp8_accuracy.log; exit 1; }'
fi

# Where the FP8 run's time goes over the real workload (steps with prefill against pure decode, the host's parts,
# kernel tables of prefill and decode windows at the workload's contexts): profile_steps.py.
if [ -z "$DRY_RUN$BENCH_ONLY" ] && [ "${PROFILE:-1}" != 0 ]; then
  step "profile steps fp8 + fp8 kv" 80 bash -c 'set -o pipefail; python3 scripts/dev/profile_steps.py qwen2-7b 16384 \
    quantization=fp8 kv_cache_dtype=fp8 2>&1 | tail -n 3'
fi

log "== summary ($(( $(date +%s) - T0 ))s)"
python3 scripts/bench/fp8_gemm.py summary 2>&1 | tee -a "$OUT/log.txt"
