#!/bin/bash
# Device call 2: kernel tests on the GPU, throughput and step profiles after the fused kernels. No HF peers.
set -o pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee $OUT/log.txt
timeout 90 python3 -m pytest -q tests/engine/attention -p no:cacheprovider 2>&1 | tail -n 15 | tee -a $OUT/log.txt
bench() {  # model budget timeout
  echo "== bench $1 budget $2 $(date +%T)" | tee -a $OUT/log.txt
  timeout $3 python3 scripts/gpu/cli.py bench throughput --model $1 --num-prompts 256 --input-len 100-1024 \
    --output-len 256 --max-num-batched-tokens $2 > $OUT/bench_${1}_$2.json 2> /tmp/bench_$1_$2.err
  echo "rc=$?" | tee -a $OUT/log.txt
  grep -v -i warn /tmp/bench_$1_$2.err | tail -n 4 >> $OUT/log.txt
}
bench qwen3-0.6b 16384 70
bench qwen2-7b 8192 80
for m in qwen3-0.6b qwen2-7b; do
  echo "== profile $m $(date +%T)" | tee -a $OUT/log.txt
  timeout 70 python3 scripts/gpu/profile_steps.py $m 8192 > /dev/null 2> /tmp/profile.err
  echo "profile rc=$?" | tee -a $OUT/log.txt; grep -v -i warn /tmp/profile.err | tail -n 3 >> $OUT/log.txt
done
for f in $OUT/bench_*.json; do python3 -c "import json,sys; r=json.load(open('$f')); print('$f'.split('/')[-1], r['elapsed_s'], round(r['output_tokens_per_s']), r['percent_of_roofline'])" 2>/dev/null || echo "$f failed"; done
head -6 $OUT/profile_qwen3-0.6b.txt $OUT/profile_qwen2-7b.txt 2>/dev/null
