#!/bin/bash
# One device call for two records (~6 min): issue 15 item 5 (fp8-speed.sh with BENCH_ONLY=1: the GPU tests, then
# the issue-7 workload on both shapes, bf16 / FP8 weights / FP8 weights + FP8 KV, the 7B ones twice, interleaved)
# and issue 16 item 5 (cold-start.sh: the 7B checkpoint written, one cold and RUNS-1 warm starts of `railyard
# serve`, then issue 7's decode benchmark). Outputs: $OUT/fp8/{log.txt,tests.txt,benches.json,bench_logs.txt} and
# $OUT/start/{log.txt,startup.json,throughput.json} (7 files; a call returns at most 8).
#   carry: .whl (the serve stack's wheels, xgrammar and apache-tvm-ffi with them)
#   env: FP8_BUDGET_S (default 240: on 2026-12-04 200 s left the 0.6B FP8 runs out after 69 s of tests), CALL_S
#        (cold-start's, default 230), RUNS (default 3), TESTS and CAPS (fp8-speed.sh's; CAPS default none here)
set -o pipefail
cd "$(dirname "$0")/../.."
ROOT_OUT=${OUT:-/tmp/fp8-and-start-out}
TESTS=${TESTS:-"tests/engine/runner/attention/test_fp8_kernels.py tests/engine/runner/test_piecewise_graphs.py"} CAPS=${CAPS-} \
  OUT=$ROOT_OUT/fp8 BENCH_ONLY=1 BUDGET_S=${FP8_BUDGET_S:-240} bash scripts/gpu/fp8-speed.sh > /dev/null 2>&1
echo "fp8-speed.sh rc=$?"; tail -n 14 "$ROOT_OUT/fp8/log.txt"
OUT=$ROOT_OUT/start RUNS=${RUNS:-3} STAGED_RUN=0 LOAD_PATHS=0 CALL_S=${CALL_S:-230} \
  bash scripts/gpu/cold-start.sh > /dev/null 2>&1
echo "cold-start.sh rc=$?"; grep -A5 "^run cache" "$ROOT_OUT/start/log.txt"; tail -n 1 "$ROOT_OUT/start/log.txt"
