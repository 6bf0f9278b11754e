#!/bin/bash
# Device call 3 (the measured comparison): our engine on both shapes, then HF transformers (static and
# continuous batching) on the same workload in the same call, then GPU correctness with what time is left.
set -o pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv | tee $OUT/log.txt
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" | tee -a $OUT/log.txt
timeout 60 python3 -m pytest -q tests/engine/attention -p no:cacheprovider 2>&1 | tail -n 4 | tee -a $OUT/log.txt
# (Call 3 measured the torch elementwise layers; fused kernels were opt-in then.)
bench() {  # model budget timeout
  echo "== bench $1 budget $2 $(date +%T)" | tee -a $OUT/log.txt
  timeout $3 python3 scripts/gpu/cli.py bench throughput --model $1 --num-prompts 256 --input-len 100-1024 \
    --output-len 256 --max-num-batched-tokens $2 > $OUT/bench_${1}.json 2> /tmp/bench_$1.err
  echo "rc=$?" | tee -a $OUT/log.txt
  grep -v -i warn /tmp/bench_$1.err | tail -n 4 | tee -a $OUT/log.txt
}
bench qwen3-0.6b 16384 60
bench qwen2-7b 8192 70
echo "== hf_baseline $(date +%T)" | tee -a $OUT/log.txt
BUDGET_S=${HF_BUDGET_S:-420} timeout 440 python3 .peers/hf_baseline.py 2>&1 | grep -v -i warn | tail -n 12 | tee -a $OUT/log.txt
LEFT=$((${CALL_S:-575} - SECONDS))
echo "== serve $(date +%T), ${LEFT}s left" | tee -a $OUT/log.txt
if [ $LEFT -gt 75 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  PYTHONPATH=/tmp/site python3 scripts/gpu/cli.py serve --model qwen2-7b --port 8011 --max-num-batched-tokens 8192 \
    > /tmp/serve.log 2>&1 &
  SERVER=$!
  for i in $(seq 1 60); do curl -sf http://127.0.0.1:8011/health > /dev/null && break; sleep 1; done
  NAME=$(curl -s http://127.0.0.1:8011/v1/models | python3 -c "import json,sys; print(json.load(sys.stdin)['data'][0]['id'])")
  echo "server up after ${i}s serving $NAME" | tee -a $OUT/log.txt
  PYTHONPATH=/tmp/site timeout $((${CALL_S:-575} - SECONDS)) python3 scripts/gpu/cli.py bench serve --url http://127.0.0.1:8011 \
    --model "$NAME" --num-prompts 512 --input-len 100-1024 --output-len 256 --max-concurrency 256 \
    > $OUT/serve_qwen2-7b.json 2> /tmp/bench_serve.err
  echo "bench serve rc=$?" | tee -a $OUT/log.txt; grep -v -i warn /tmp/bench_serve.err | tail -n 22 | tee -a $OUT/log.txt
  kill $SERVER; wait $SERVER 2>/dev/null; grep -v -i warn /tmp/serve.log | grep -i "engine\|error" | tail -n 4 >> $OUT/log.txt
fi
LEFT=$((${CALL_S:-575} - SECONDS))
echo "== correctness $(date +%T), ${LEFT}s left" | tee -a $OUT/log.txt
[ $LEFT -gt 20 ] && timeout $LEFT python3 scripts/gpu/correctness.py > /tmp/correctness.log 2>&1
echo "correctness rc=$?" | tee -a $OUT/log.txt
for f in $OUT/bench_*.json; do python3 -c "import json,sys; r=json.load(open('$f')); print('$f'.split('/')[-1], r['elapsed_s'], round(r['output_tokens_per_s']), r['percent_of_roofline'])" 2>/dev/null || echo "$f failed"; done
python3 -c "import json; [print(r) for r in json.load(open('$OUT/hf_baseline.json'))]" 2>/dev/null
