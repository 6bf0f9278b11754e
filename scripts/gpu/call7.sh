#!/bin/bash
# Device call 7: GPU correctness against HF (the code measured in call 6), the online run at 256 streams,
# and the tensor-parallel check script at tensor_parallel_size 1 (the only GPU kind lent).
set -o pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
git log --oneline -1 | tee $OUT/log.txt
echo "== correctness $(date +%T)" | tee -a $OUT/log.txt
timeout 130 python3 scripts/gpu/correctness.py > $OUT/correctness.log 2>&1
echo "correctness rc=$?" | tee -a $OUT/log.txt
python3 -c "
import json; r=json.load(open('$OUT/correctness.json'))
for k, v in r.items(): print(k, v if not isinstance(v, list) else [x.get('ok', x.get('identical')) for x in v])" | cut -c1-400 | tee -a $OUT/log.txt
LEFT=$((${CALL_S:-330} - SECONDS))
echo "== serve $(date +%T), ${LEFT}s left" | tee -a $OUT/log.txt
if [ $LEFT -gt 70 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  PYTHONPATH=/tmp/site python3 scripts/gpu/cli.py serve --model qwen2-7b --port 8011 --max-num-batched-tokens 8192 \
    > $OUT/serve.log 2>&1 &
  SERVER=$!
  for i in $(seq 1 60); do curl -sf http://127.0.0.1:8011/health > /dev/null && break; sleep 1; done
  NAME=$(curl -s http://127.0.0.1:8011/v1/models | python3 -c "import json,sys; print(json.load(sys.stdin)['data'][0]['id'])")
  echo "server up after ${i}s serving $NAME" | tee -a $OUT/log.txt
  PYTHONPATH=/tmp/site timeout $((${CALL_S:-330} - SECONDS - 5)) python3 scripts/gpu/cli.py bench serve \
    --url http://127.0.0.1:8011 --model "$NAME" --num-prompts 512 --input-len 100-1024 --output-len 256 \
    --max-concurrency 256 > $OUT/serve_qwen2-7b.json 2> $OUT/bench_serve.err
  echo "bench serve rc=$?" | tee -a $OUT/log.txt; grep -v -i warn $OUT/bench_serve.err | tail -n 12 | tee -a $OUT/log.txt
  kill $SERVER; wait $SERVER 2>/dev/null
fi
echo "== tp_check --tp 1 $(date +%T)" | tee -a $OUT/log.txt
PYTHONPATH=. timeout 60 python3 scripts/gpu/tp_check.py --tp 1 > $OUT/tp_check_tp1.json 2> $OUT/tp_check.err
echo "tp_check rc=$?" | tee -a $OUT/log.txt; head -c 600 $OUT/tp_check_tp1.json | tee -a $OUT/log.txt
