#!/bin/bash
# Device call 6 (the measured comparison, both shapes in one call): kernel tests, our engine on both shapes,
# then HF transformers static and continuous batching on the same workload. Defaults: asynchronous
# scheduling, fused kernels on. Call 7 follows with correctness and the online run.
set -o pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/log.txt
git log --oneline -1 | tee -a $OUT/log.txt
timeout 60 python3 -m pytest -q tests/engine/attention -p no:cacheprovider 2>&1 | tail -n 2 | tee -a $OUT/log.txt
bench() {  # model budget timeout
  echo "== bench $1 budget $2 $(date +%T)" | tee -a $OUT/log.txt
  timeout $3 python3 scripts/gpu/cli.py bench throughput --model $1 --num-prompts 256 --input-len 100-1024 \
    --output-len 256 --max-num-batched-tokens $2 > $OUT/bench_${1}.json 2> $OUT/bench_$1.err
  echo "rc=$?" | tee -a $OUT/log.txt
  grep -i "roofline\|memory profile\|engine ready\|captured" $OUT/bench_$1.err | tee -a $OUT/log.txt
}
bench qwen3-0.6b 16384 60
bench qwen2-7b 16384 70
echo "== hf_baseline $(date +%T)" | tee -a $OUT/log.txt
BUDGET_S=${HF_BUDGET_S:-350} timeout 370 python3 .peers/hf_baseline.py 2>&1 | grep -v -i warn | tail -n 8 | tee -a $OUT/log.txt
for f in $OUT/bench_*.json; do python3 -c "import json,sys; r=json.load(open('$f')); print('$f'.split('/')[-1], r['elapsed_s'], round(r['output_tokens_per_s']), r['percent_of_roofline'])" 2>/dev/null || echo "$f failed"; done | tee -a $OUT/log.txt
python3 -c "import json; [print(r) for r in json.load(open('$OUT/hf_baseline.json'))]" 2>/dev/null | tee -a $OUT/log.txt
