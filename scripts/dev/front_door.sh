#!/bin/bash
# Where a TP engine listens (front-door hardening), one device call on nvidia-h200-x2 (2 GPUs), ~3 minutes:
#  1. a tensor-parallel engine (NCCL, 2 GPUs) listens on loopback only: the rendezvous store, and what NCCL's
#     bootstrap opens (reported, for a decision);
#  2. bench throughput on the H200 still prints its roofline percentage (the device's peaks are known), and
#     on this device the note of an unknown device does not appear.
set -o pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/log.txt
timeout 240 python3 scripts/dev/tp_listeners.py --tp 2 > $OUT/tp_listeners.json 2> $OUT/tp_listeners.err
echo "tp_listeners rc=$? (0: every listener on loopback)" | tee -a $OUT/log.txt
python3 -c "
import json; r=json.load(open('$OUT/tp_listeners.json'))
print('tokens', r['tokens'], 'all_loopback', r['all_loopback'])
for s in r['rank0']: print('rank0', s)
for pid, socks in r['workers'].items():
    for s in socks: print('worker', pid, s)" 2>&1 | tee -a $OUT/log.txt
timeout 150 python3 scripts/bench/cli.py bench throughput --model qwen2-7b --num-prompts 64 --input-len 100-512 \
  --output-len 64 > $OUT/bench_qwen2-7b.json 2> $OUT/bench.err
echo "bench rc=$?" | tee -a $OUT/log.txt; grep roofline $OUT/bench.err | tee -a $OUT/log.txt
python3 -c "
import json; r=json.load(open('$OUT/bench_qwen2-7b.json'))
print('percent_of_roofline', r['percent_of_roofline'], 'note', r.get('roofline_note'))" 2>&1 | tee -a $OUT/log.txt
