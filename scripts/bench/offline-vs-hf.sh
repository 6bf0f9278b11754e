#!/bin/bash
# BENCHMARKS.md "Engine on one GPU: offline throughput against HF transformers, roofline": railyard's offline
# throughput on the issue's workload (256 prompts of 100-1024 tokens, 256 output tokens, EOS ignored, greedy,
# bf16 random weights) for each named shape, with the roofline and the engine's start-up memory report, then
# HF transformers (static batch 256 and continuous batching) on the same prompts.
#
# Prints the section's JSON on stdout: {"railyard": {shape: bench JSON}, "hf": hf_baseline.py's records, ...};
# logs and raw files go to $OUT. About 6 minutes on one H200 (HF's share is HF_BUDGET_S).
#
#   bash scripts/bench/offline-vs-hf.sh                 # carry .peers (a copy of /work/shared/peers) for HF
#   SHAPES=qwen2-7b HF=0 bash scripts/bench/offline-vs-hf.sh    # railyard's 7B run only
#   KERNEL_TESTS=0 bash scripts/bench/offline-vs-hf.sh   # without the attention and kernel tests first
#   SMOKE=1 bash scripts/bench/offline-vs-hf.sh         # the script's plumbing on a CPU: tiny model, 8 prompts
#   SHAPES=qwen3-30b-a3b RY_TIMEOUT_S=300 bash scripts/bench/offline-vs-hf.sh   # a mixture of experts (HF: its own
#                                                       # MoE code; 48 layers of graphs to capture on railyard's side)
source "$(dirname "$0")/common.sh"
. scripts/device/wheels.sh; carried_wheels .whl || exit 1  # the engine needs msgspec: carry .whl where the machine lacks it
SHAPES=${SHAPES:-qwen3-0.6b qwen2-7b}
HF_BUDGET_S=${HF_BUDGET_S:-350}
RY_TIMEOUT_S=${RY_TIMEOUT_S:-240}  # per shape: start-up (weights, graph capture) and the run
PEER=$(ls .peers/hf_baseline.py shared/peers/hf_baseline.py 2>/dev/null | head -n 1)
HF=${HF:-1}
EXTRA=()
if [ -n "${SMOKE:-}" ]; then
  SHAPES=$(python3 -c "from railyard.engine.startup.tiny_model import ensure_tiny_model; print(ensure_tiny_model())")
  EXTRA=(--device cpu --num-prompts 8 --input-len 16-64 --output-len 8 --max-num-batched-tokens 2048 --warmup-prompts 1)
  HF=0
fi

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
python3 -c "import json, torch, transformers; print(json.dumps({'torch': torch.__version__, \
'transformers': transformers.__version__, 'cuda': torch.version.cuda}))" > "$OUT/versions.json" 2>> "$OUT/log.txt"
if [ -z "${SMOKE:-}" ] && [ "${KERNEL_TESTS:-1}" = 1 ]; then
  log "kernel tests"
  timeout 150 python3 -m pytest -q tests/engine/runner/attention tests/engine/runner/kernels -p no:cacheprovider > "$OUT/kernel_tests.txt" 2>&1
  tail -n 1 "$OUT/kernel_tests.txt" > "$OUT/kernel_tests_summary.txt"
fi

ARGS=()
for shape in $SHAPES; do
  key=$(basename "$shape")
  log "railyard bench throughput $key"
  timeout "$RY_TIMEOUT_S" python3 scripts/bench/cli.py bench throughput --model "$shape" --num-prompts 256 --input-len 100-1024 \
    --output-len 256 --max-num-batched-tokens 16384 "${EXTRA[@]}" > "$OUT/bench_$key.json" 2> "$OUT/bench_$key.err"
  echo "rc=$?" | tee -a "$OUT/log.txt" >&2
  grep -i "roofline:\|memory profile\|engine ready" "$OUT/bench_$key.err" | tee -a "$OUT/log.txt" >&2
  ARGS+=("railyard.$key@=$OUT/bench_$key.json")
done

if [ "$HF" = 1 ] && [ -n "$PEER" ]; then
  log "HF transformers ($PEER, budget ${HF_BUDGET_S}s)"
  SHAPES=$(echo $SHAPES | tr ' ' ',') OUT="$OUT" BUDGET_S=$HF_BUDGET_S timeout $((HF_BUDGET_S + 30)) python3 "$PEER" > "$OUT/hf_baseline.log" 2>&1
  echo "rc=$?" | tee -a "$OUT/log.txt" >&2
  ARGS+=("hf@=$OUT/hf_baseline.json")
else
  ARGS+=("hf=not run (HF=$HF; hf_baseline.py ${PEER:-not found: carry .peers})")
fi

python3 scripts/bench/merge_json.py section="offline throughput against HF transformers, roofline" commit="$COMMIT" \
  workload="256 prompts 100-1024 tokens (seed 0), 256 output tokens, EOS ignored, greedy, max_num_batched_tokens 16384" \
  gpu#="$OUT/gpu.txt" versions@="$OUT/versions.json" kernel_tests#="$OUT/kernel_tests_summary.txt" "${ARGS[@]}" \
  | tee "$OUT/offline-vs-hf.json"
