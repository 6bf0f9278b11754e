#!/bin/bash
# Device call 5 (exploratory): fused kernels' GPU tests (rotary included), GPU correctness with the fused
# kernels on, the 7B shape at two token budgets with them on, and a step profile of the 7B shape.
set -o pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
timeout 100 python3 -m pytest -q tests/engine/attention -p no:cacheprovider 2>&1 | tail -n 6 | tee $OUT/log.txt
echo "== correctness fused $(date +%T)" | tee -a $OUT/log.txt
RAILYARD_FUSED_KERNELS=1 timeout 150 python3 scripts/gpu/correctness.py > $OUT/correctness.log 2>&1
echo "correctness rc=$?" | tee -a $OUT/log.txt
python3 -c "
import json; r=json.load(open('$OUT/correctness.json'))
for k, v in r.items(): print(k, v if not isinstance(v, list) else [x.get('ok', x.get('identical')) for x in v])" | cut -c1-400 | tee -a $OUT/log.txt
for b in 8192 16384; do
  echo "== bench qwen2-7b budget $b fused $(date +%T)" | tee -a $OUT/log.txt
  RAILYARD_FUSED_KERNELS=1 timeout 70 python3 scripts/gpu/cli.py bench throughput --model qwen2-7b --num-prompts 256 \
    --input-len 100-1024 --output-len 256 --max-num-batched-tokens $b > $OUT/bench_7b_$b.json 2> /tmp/b.err
  echo "rc=$?" | tee -a $OUT/log.txt; grep roofline /tmp/b.err | tee -a $OUT/log.txt
done
LEFT=$((${CALL_S:-300} - SECONDS))
echo "== profile $(date +%T), ${LEFT}s left" | tee -a $OUT/log.txt
[ $LEFT -gt 40 ] && RAILYARD_FUSED_KERNELS=1 timeout $((LEFT - 5)) python3 scripts/gpu/profile_steps.py qwen2-7b 8192 > /tmp/profile.log 2>&1
echo "profile rc=$?" | tee -a $OUT/log.txt; head -n 8 $OUT/profile_qwen2-7b.txt | tee -a $OUT/log.txt
