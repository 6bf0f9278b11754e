#!/bin/bash
# Device call 8: after the decode/prefill kernels began sharing one tile step (_attend_tile): kernel tests,
# GPU correctness against HF, and the 7B-shape benchmark, to confirm neither results nor speed moved.
set -o pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
timeout 60 python3 -m pytest -q tests/engine/attention -p no:cacheprovider 2>&1 | tail -n 2 | tee $OUT/log.txt
timeout 130 python3 scripts/gpu/correctness.py > $OUT/correctness.log 2>&1
echo "correctness rc=$?" | tee -a $OUT/log.txt
python3 -c "
import json; r=json.load(open('$OUT/correctness.json'))
for k, v in r.items(): print(k, v if not isinstance(v, list) else [x.get('ok', x.get('identical')) for x in v])" | cut -c1-300 | tee -a $OUT/log.txt
timeout 70 python3 scripts/gpu/cli.py bench throughput --model qwen2-7b --num-prompts 256 --input-len 100-1024 \
  --output-len 256 --max-num-batched-tokens 16384 > $OUT/bench_qwen2-7b.json 2> $OUT/bench.err
echo "bench rc=$?" | tee -a $OUT/log.txt; grep roofline $OUT/bench.err | tee -a $OUT/log.txt
