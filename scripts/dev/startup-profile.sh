#!/bin/bash
# Where a warm start of the qwen2-7b shape spends its time, one device call (~3 minutes; run once,
# 2026-12-03, BENCHMARKS.md: the front's AutoTokenizer import):
# `railyard bench startup` writes the random-weight checkpoint and starts `railyard serve` on it twice (cold, then
# warm, into one railyard cache); then one more warm start runs under py-spy (`record --subprocesses --threads`,
# collapsed stacks: the front with its tokenizer thread, and the engine process), so each start-up phase has its
# functions. Beside it, in fresh processes and nothing else running: `import torch`, the engine's imports, and the
# front's tokenizer load (import transformers, then from_pretrained), each timed.
# Writes three files (a device call returns at most 8): $OUT/startup.json, $OUT/pyspy_summary.txt (per process and
# thread, from the collapsed stacks, which stay in $WORK with the profiled server's log) and $OUT/log.txt.
#   carry: .whl (fastapi, uvicorn, pyzmq, msgspec, py-spy, ...)
#   env: CKPT (default /tmp/qwen2-7b), PORT (default 8931), RATE (py-spy samples/s, default 250)
set -o pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; BUDGET_S=${BUDGET_S:-400}
. scripts/device/steps.sh
header
CKPT=${CKPT:-/tmp/qwen2-7b}; PORT=${PORT:-8931}; RATE=${RATE:-250}
export RAILYARD_CACHE=$(mktemp -d)
WORK=$(mktemp -d); export WORK

alone() {  # fresh processes, one thing each, nothing else running
  for i in 1 2; do
    python3 -c "import time; t = time.perf_counter(); import torch; print('import torch', round(time.perf_counter() - t, 2), 's')"
  done
  python3 -c "
import time; t = time.perf_counter()
from railyard.engine.core.process import _import_engine; _import_engine()
print('engine imports (_import_engine)', round(time.perf_counter() - t, 2), 's')"
  python3 -c "
import time
t = time.perf_counter(); import transformers; a = time.perf_counter() - t
t = time.perf_counter(); from transformers import AutoTokenizer; b = time.perf_counter() - t
from railyard.engine.tokenizer import load_tokenizer
t = time.perf_counter(); tok = load_tokenizer('$CKPT'); c = time.perf_counter() - t
print(f'tokenizer alone: import transformers {a:.2f} s, AutoTokenizer {b:.2f} s, load_tokenizer {c:.2f} s ({type(tok).__name__})')"
  python3 -c "
import sys, time; t = time.perf_counter()
from railyard.engine.tokenizer import load_tokenizer
tok = load_tokenizer('$CKPT')
print(f'tokenizer from railyard\'s cache (the starts above filled it): {time.perf_counter() - t:.2f} s ({type(tok).__name__}; '
      f'torch imported: {\"torch\" in sys.modules})')"
  python3 -c "
import time; t = time.perf_counter()
from railyard.api.cli import _import_front; _import_front()
print('front imports (_import_front)', round(time.perf_counter() - t, 2), 's')"
}
export -f alone
export CKPT

profiled_start() {  # one warm start under py-spy, stopped (by its PID) at its first /health 200
  py-spy record --subprocesses --threads --format raw --rate $RATE -o $WORK/pyspy.txt -- \
    python3 -m railyard.cli serve --model $CKPT --port $PORT --log-level info > $WORK/serve.log 2>&1 &
  local pid=$!
  for i in $(seq 1 1200); do
    curl -sf http://127.0.0.1:$PORT/health > /dev/null && break
    sleep 0.1
  done
  sleep 1
  local serve; serve=$(pgrep -P $pid -f "railyard.cli serve" | head -1)
  kill -INT ${serve:-$pid}
  wait $pid
  grep "start-up" $WORK/serve.log | tee -a $OUT/log.txt
}
export -f profiled_start
export OUT PORT RATE

step "bench startup (cold, warm)" 150 python3 -m railyard.cli bench startup --model qwen2-7b --checkpoint-dir $CKPT \
  --runs 2 --cache-dir $RAILYARD_CACHE --output $OUT/startup.json
python3 -c "
import json; d = json.load(open('$OUT/startup.json'))
for r in d['runs']: print(r['cache'], round(r['total_s'], 2), {p: round(s, 2) for p, s in r['phases_s'].items()}, r.get('background_s'))
" | tee -a $OUT/log.txt
step "alone" 90 bash -c 'alone > $WORK/alone.txt 2>&1'
cat $WORK/alone.txt | tee -a $OUT/log.txt
step "profiled warm start" 90 profiled_start
python3 scripts/dev/pyspy_phases.py $WORK/pyspy.txt --top 40 > $OUT/pyspy_summary.txt
head -80 $OUT/pyspy_summary.txt
rm -rf $RAILYARD_CACHE $WORK
[ -n "$KEEP_CKPT" ] || rm -rf $CKPT
