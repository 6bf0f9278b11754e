#!/bin/bash
# BENCHMARKS.md "Where the remaining time goes": where the offline benchmark of a named shape spends its
# time (scripts/dev/profile_steps.py: wall time per step with and without prefill, one decode graph replay
# at full batch, top CUDA kernels of a prefill and a decode window) and a sweep of the paged decode kernel's
# launch configuration (scripts/dev/tune_decode.py).
#
# Prints the section's JSON on stdout: {"profile": profile_<shape>.json, "tune_decode": tune_decode.json};
# the kernel tables are in $OUT/profile_<shape>.txt. About 3 minutes on one H200.
#
#   bash scripts/dev/step-profile.sh                  # SHAPE=qwen2-7b BUDGET=8192 by default
source "$(dirname "$0")/../bench/common.sh"
SHAPE=${SHAPE:-qwen2-7b}
BUDGET=${BUDGET:-8192}

log "profile_steps $SHAPE $BUDGET"
OUT="$OUT" timeout 240 python3 scripts/dev/profile_steps.py "$SHAPE" "$BUDGET" > "$OUT/profile.log" 2>&1
echo "rc=$?" | tee -a "$OUT/log.txt" >&2
head -n 8 "$OUT/profile_$SHAPE.txt" >&2
log "tune_decode"
OUT="$OUT" timeout 150 python3 scripts/dev/tune_decode.py > "$OUT/tune_decode.log" 2>&1
echo "rc=$?" | tee -a "$OUT/log.txt" >&2

python3 scripts/bench/merge_json.py section="where the remaining time goes" commit="$COMMIT" \
  profile@="$OUT/profile_$SHAPE.json" tune_decode@="$OUT/tune_decode.json" | tee "$OUT/step-profile.json"
