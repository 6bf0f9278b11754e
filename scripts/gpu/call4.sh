#!/bin/bash
# Device call 4 (exploratory, no peers): asynchronous scheduling on both shapes, fused elementwise kernels
# off and on, GPU correctness of the async path against HF, then a step profile of the 0.6B shape.
set -o pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv | tee $OUT/log.txt
nproc | tee -a $OUT/log.txt
timeout 100 python3 -m pytest -q tests/engine/attention -p no:cacheprovider 2>&1 | tail -n 6 | tee -a $OUT/log.txt
bench() {  # model budget timeout fused tag
  echo "== bench $1 budget $2 fused=$4 $(date +%T)" | tee -a $OUT/log.txt
  RAILYARD_FUSED_KERNELS=$4 timeout $3 python3 scripts/gpu/cli.py bench throughput --model $1 --num-prompts 256 \
    --input-len 100-1024 --output-len 256 --max-num-batched-tokens $2 > $OUT/bench_${1}_$5.json 2> /tmp/bench_$1_$5.err
  echo "rc=$?" | tee -a $OUT/log.txt
  grep -v -i warn /tmp/bench_$1_$5.err | tail -n 3 | tee -a $OUT/log.txt
}
bench qwen3-0.6b 16384 60 0 async
bench qwen3-0.6b 16384 60 1 async_fused
bench qwen2-7b 8192 70 0 async
bench qwen2-7b 8192 70 1 async_fused
echo "== correctness $(date +%T)" | tee -a $OUT/log.txt
timeout 150 python3 scripts/gpu/correctness.py > $OUT/correctness.log 2>&1
echo "correctness rc=$?" | tee -a $OUT/log.txt; tail -n 25 $OUT/correctness.log | tee -a $OUT/log.txt
LEFT=$((${CALL_S:-540} - SECONDS))
echo "== profile $(date +%T), ${LEFT}s left" | tee -a $OUT/log.txt
[ $LEFT -gt 40 ] && RAILYARD_FUSED_KERNELS=${PROFILE_FUSED:-0} timeout $((LEFT - 10)) python3 scripts/gpu/profile_steps.py qwen3-0.6b 16384 > /tmp/profile.log 2>&1
echo "profile rc=$?" | tee -a $OUT/log.txt; tail -n 5 /tmp/profile.log >> $OUT/log.txt
for f in $OUT/bench_*.json; do python3 -c "import json,sys; r=json.load(open('$f')); print('$f'.split('/')[-1], r['elapsed_s'], round(r['output_tokens_per_s']), r['percent_of_roofline'])" 2>/dev/null || echo "$f failed"; done | tee -a $OUT/log.txt
