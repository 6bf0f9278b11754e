#!/bin/bash
# Device call 2: kernel tests and correctness on the GPU, throughput + step profile after fusing,
# online serving of the 7B shape (railyard serve + railyard bench serve, 256 streams). No HF peers.
set -o pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee $OUT/log.txt
timeout 90 python3 -m pytest -q tests/engine/attention -p no:cacheprovider 2>&1 | tail -n 6 | tee -a $OUT/log.txt
bench() {  # model budget timeout
  echo "== bench $1 budget $2 $(date +%T)" | tee -a $OUT/log.txt
  timeout $3 python3 scripts/gpu/cli.py bench throughput --model $1 --num-prompts 256 --input-len 100-1024 \
    --output-len 256 --max-num-batched-tokens $2 > $OUT/bench_${1}_$2.json 2> /tmp/bench_$1_$2.err
  echo "rc=$?" | tee -a $OUT/log.txt
  grep -v -i warn /tmp/bench_$1_$2.err | tail -n 4 >> $OUT/log.txt
}
bench qwen2-7b 8192 75
bench qwen3-0.6b 16384 60
echo "== profile $(date +%T)" | tee -a $OUT/log.txt
timeout 60 python3 scripts/gpu/profile_steps.py qwen2-7b 8192 > /dev/null 2> /tmp/profile.err
echo "profile rc=$?" | tee -a $OUT/log.txt; grep -v -i warn /tmp/profile.err | tail -n 3 >> $OUT/log.txt
echo "== serve $(date +%T)" | tee -a $OUT/log.txt
python3 scripts/gpu/cli.py serve --model qwen2-7b --port 8011 --max-num-batched-tokens 8192 > /tmp/serve.log 2>&1 &
SERVER=$!
for i in $(seq 1 90); do curl -sf http://127.0.0.1:8011/health > /dev/null && break; sleep 1; done
NAME=$(curl -s http://127.0.0.1:8011/v1/models | python3 -c "import json,sys; print(json.load(sys.stdin)['data'][0]['id'])")
echo "server up after ${i}s serving $NAME" | tee -a $OUT/log.txt
timeout 100 python3 scripts/gpu/cli.py bench serve --url http://127.0.0.1:8011 --model "$NAME" --num-prompts 512 \
  --input-len 100-1024 --output-len 256 --max-concurrency 256 > $OUT/serve_qwen2-7b.json 2> /tmp/bench_serve.err
echo "bench serve rc=$?" | tee -a $OUT/log.txt; tail -n 25 /tmp/bench_serve.err >> $OUT/log.txt
kill $SERVER; wait $SERVER 2>/dev/null; grep -v -i warn /tmp/serve.log | tail -n 5 >> $OUT/log.txt
echo "== correctness $(date +%T)" | tee -a $OUT/log.txt
timeout 150 python3 scripts/gpu/correctness.py > /tmp/correctness.log 2>&1; echo "correctness rc=$?" | tee -a $OUT/log.txt
tail -n 3 /tmp/correctness.log
for f in $OUT/bench_*.json; do python3 -c "import json,sys; r=json.load(open('$f')); print('$f'.split('/')[-1], r['elapsed_s'], round(r['output_tokens_per_s']), r['percent_of_roofline'])" 2>/dev/null || echo "$f failed"; done
head -8 $OUT/profile_qwen2-7b.txt 2>/dev/null
tail -n 25 /tmp/bench_serve.err
