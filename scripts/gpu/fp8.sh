#!/bin/bash
# Issue 15 (FP8 weights and an FP8 KV cache) in one device call on one H200, under ~8 minutes:
#   1. the FP8 kernel / layer / KV-cache tests and the Triton backend tests on the GPU;
#   2. bf16 vs FP8 GEMM rates (the roofline's FP8 peak) and the per-token quantization kernel's bandwidth;
#   3. `bench throughput`, issue-7 workload, qwen2-7b shape: bf16, FP8 weights, FP8 weights + FP8 KV;
#   4. accuracy on the qwen2-7b shape (per-layer cosine, logit KL, top-1 vs bf16);
#   5. the same three benchmarks on the qwen3-0.6b shape;
#   6. greedy agreement of the float32 tiny models on the GPU (FP8 KV vs bf16 KV).
# Each step runs under `timeout`, and no step starts once the budget (BUDGET_S, default 470 s) is spent,
# so an early failure or hang costs its own step only. Results: $OUT/log.txt (summary table last),
# $OUT/*.json, $OUT/*.err (INFO logs: memory profile with KV blocks and dtype, GEMM path, roofline).
set -o pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
export OUT=${OUT:-/tmp/fp8-out}
BUDGET_S=${BUDGET_S:-470}
. scripts/gpu/steps.sh  # log, step (under the budget), header, the carried wheels
header

tests() {
  python3 -m pytest -q -p no:cacheprovider tests/engine/runner/layers/test_fp8.py tests/engine/runner/attention/test_fp8_kernels.py \
    tests/engine/runner/attention/test_fp8_kv_cache.py tests/engine/runner/attention/test_triton_backend.py > "$OUT/tests.txt" 2>&1
  local rc=$?
  tail -n 15 "$OUT/tests.txt" | tee -a "$OUT/log.txt"
  return $rc
}
export -f tests
[ -z "$SKIP_TESTS" ] && step tests 150 tests

step gemm 60 python3 scripts/gpu/fp8_check.py gemm > "$OUT/gemm.log" 2>&1
FP8_PEAK=$(python3 -c "import json; print(json.load(open('$OUT/fp8_gemm.json'))['fp8_peak_for_roofline'])" 2>/dev/null)
log "   fp8 peak for the roofline: ${FP8_PEAK:-default (2x bf16)}"
export PEAK_ARGS=${FP8_PEAK:+--fp8-peak-tflops $FP8_PEAK}

bench() {  # model variant flags...
  local model=$1 variant=$2; shift 2
  python3 scripts/gpu/cli.py bench throughput --model "$model" --num-prompts 256 --input-len 100-1024 \
    --output-len 256 --max-num-batched-tokens 16384 $PEAK_ARGS "$@" \
    > "$OUT/bench_${model}_${variant}.json" 2> "$OUT/bench_${model}_${variant}.err"
  local rc=$?
  grep -h "memory profile\|engine ready\|GEMMs:\|roofline:" "$OUT/bench_${model}_${variant}.err" | cut -c1-400 \
    | tee -a "$OUT/log.txt"
  return $rc
}
export -f bench
step "bench qwen2-7b bf16" 100 bench qwen2-7b bf16
step "bench qwen2-7b fp8" 100 bench qwen2-7b fp8 --quantization fp8
step "bench qwen2-7b fp8+kv" 100 bench qwen2-7b fp8kv --quantization fp8 --kv-cache-dtype fp8

[ -z "$SKIP_ACCURACY" ] && step "accuracy qwen2-7b" 120 python3 scripts/gpu/fp8_check.py accuracy > "$OUT/accuracy.log" 2>&1

step "bench qwen3-0.6b bf16" 75 bench qwen3-0.6b bf16
step "bench qwen3-0.6b fp8" 75 bench qwen3-0.6b fp8 --quantization fp8
step "bench qwen3-0.6b fp8+kv" 75 bench qwen3-0.6b fp8kv --quantization fp8 --kv-cache-dtype fp8

step "tiny greedy agreement" 60 python3 scripts/gpu/fp8_check.py tiny > "$OUT/tiny.log" 2>&1

log "== summary ($(( $(date +%s) - T0 ))s)"
python3 - "$OUT" <<'EOF' 2>&1 | tee -a "$OUT/log.txt"
import json, os, sys
out = sys.argv[1]
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except Exception as exc:
        return {"missing": repr(exc)[:120]}
print("shape       variant  seconds  out tok/s  x bf16  KV blocks  x bf16  % roofline")
for model in ("qwen2-7b", "qwen3-0.6b"):
    base = load(f"bench_{model}_bf16.json")
    for variant in ("bf16", "fp8", "fp8kv"):
        r = load(f"bench_{model}_{variant}.json")
        if "elapsed_s" not in r:
            print(f"{model:11} {variant:7}  failed ({r.get('missing', '')})")
            continue
        speed = r["output_tokens_per_s"] / base["output_tokens_per_s"] if "output_tokens_per_s" in base else float("nan")
        blocks = r["num_kv_blocks"] / base["num_kv_blocks"] if "num_kv_blocks" in base else float("nan")
        print(f"{model:11} {variant:7} {r['elapsed_s']:8.2f} {r['output_tokens_per_s']:10.0f} {speed:7.2f} "
              f"{r['num_kv_blocks']:10d} {blocks:7.2f} {r['percent_of_roofline']:10.1f}")
g = load("fp8_gemm.json")
for row in g.get("rows", []):
    print("gemm", row)
a = load("fp8_accuracy.json")
for k, v in a.items():
    if isinstance(v, dict) and "layer_cosine" in v:
        print(f"accuracy 7B {k}: min layer cos {min(v['layer_cosine']):.5f} (last {v['layer_cosine'][-1]:.5f}), "
              f"KL mean {v['logit_kl_mean']:.5f} max {v['logit_kl_max']:.4f}, top1 {v['top1_agreement']:.4f}")
    elif k not in ("model", "reference", "prompt_lens", "seconds"):
        print("accuracy", k, v)
for arch, v in load("fp8_tiny.json").items():
    print("tiny", arch, v)
EOF
