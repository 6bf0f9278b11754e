#!/bin/bash
# BENCHMARKS.md "Correctness on the GPU": the Triton kernel tests on the GPU, scripts/bench/correctness.py
# (greedy tokens identical to HF transformers on the tiny models and the 0.6B shape, 7B-shape bf16 logits
# against HF, Triton kernels against the torch reference backend) and the tensor-parallel check
# (scripts/bench/tp_check.py, TP over every visible GPU, TP 1 on a one-GPU machine).
#
# Prints the section's JSON on stdout: {"kernel_tests": pytest's summary, "correctness": correctness.json,
# "tp_check": tp_check.py's JSON}; logs go to $OUT. About 3 minutes on one H200.
#
#   bash scripts/bench/correctness.sh
source "$(dirname "$0")/common.sh"
. scripts/device/wheels.sh; carried_wheels .whl || exit 1  # the engine needs msgspec: carry .whl where the machine lacks it

log "kernel tests"
timeout 150 python3 -m pytest -q tests/engine/runner/attention tests/engine/runner/kernels -p no:cacheprovider > "$OUT/kernel_tests.txt" 2>&1
tail -n 1 "$OUT/kernel_tests.txt" | tee "$OUT/kernel_tests_summary.txt" >&2
log "correctness against HF transformers"
OUT="$OUT" timeout 240 python3 scripts/bench/correctness.py > "$OUT/correctness.log" 2>&1
echo "rc=$?" | tee -a "$OUT/log.txt" >&2
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU")
log "tp_check --tp ${GPUS:-1}"
PYTHONPATH=. timeout 120 python3 scripts/bench/tp_check.py --tp "${GPUS:-1}" > "$OUT/tp_check.json" 2> "$OUT/tp_check.err"
echo "rc=$?" | tee -a "$OUT/log.txt" >&2

python3 scripts/bench/merge_json.py section="correctness on the GPU" commit="$COMMIT" \
  kernel_tests#="$OUT/kernel_tests_summary.txt" correctness@="$OUT/correctness.json" tp_check@="$OUT/tp_check.json" \
  | tee "$OUT/correctness-summary.json"
