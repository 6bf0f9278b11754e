#!/bin/bash
# Device call 1: our throughput for both shapes at two token budgets, correctness, a profile. No HF peers.
set -o pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv | tee $OUT/log.txt
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" | tee -a $OUT/log.txt
bench() {  # model budget timeout
  echo "== bench $1 budget $2 $(date +%T)" | tee -a $OUT/log.txt
  timeout $3 python3 scripts/gpu/cli.py bench throughput --model $1 --num-prompts 256 --input-len 100-1024 \
    --output-len 256 --max-num-batched-tokens $2 > $OUT/bench_${1}_$2.json 2> /tmp/bench_$1_$2.err
  echo "rc=$?" | tee -a $OUT/log.txt
  grep -v -i warn /tmp/bench_$1_$2.err | tail -n 8 >> $OUT/log.txt
}
bench qwen3-0.6b 8192 80
bench qwen2-7b 8192 90
echo "== correctness $(date +%T)" | tee -a $OUT/log.txt
timeout 170 python3 scripts/gpu/correctness.py > $OUT/correctness.log 2>&1; echo "correctness rc=$?" | tee -a $OUT/log.txt
bench qwen3-0.6b 2048 70
bench qwen2-7b 2048 80
echo "== profile $(date +%T)" | tee -a $OUT/log.txt
timeout 75 python3 scripts/gpu/profile_steps.py qwen2-7b 8192 > /dev/null 2> /tmp/profile.err
echo "profile rc=$?" | tee -a $OUT/log.txt; tail -n 5 /tmp/profile.err >> $OUT/log.txt
tail -n 30 $OUT/correctness.log
for f in $OUT/bench_*.json; do python3 -c "import json,sys; r=json.load(open('$f')); print('$f'.split('/')[-1], r['elapsed_s'], round(r['output_tokens_per_s']), r['percent_of_roofline'])" 2>/dev/null || echo "$f failed"; done
head -12 $OUT/profile_qwen2-7b.txt 2>/dev/null
