#!/bin/bash
# Online serving on the H200, one device call: the same 512 requests offline
# (`railyard bench throughput`) and served (`railyard serve` + `railyard bench serve`) at 256 streams and at
# Poisson 8 req/s, for several long-prefill caps, the engine core in its own process against the in-process
# engine; 64 streams; py-spy profiles of both server processes under 256 streams. Writes $OUT/results.tgz and $OUT/summary.txt.
#   carry: .whl (fastapi, starlette, uvicorn, pydantic(-core), httptools, pyzmq, msgspec, py-spy, ...)
#   env: CALL_S (seconds this call may use, default 540), BUDGETS (offline budgets), SERVE_BUDGET (default 8192),
#        THRESHOLDS (long_prefill_token_threshold values served, engine process), PROFILE_T (the one also run
#        at 64 streams, in-process, and profiled; none: neither), MODEL/WORK/ENGINE (a dry run on a small model),
#        SKIP_WHEELS
set -o pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
. scripts/device/wheels.sh
carried_wheels .whl || { echo "wheel install failed"; exit 1; }
R=/tmp/results; mkdir -p $R; LOG=$R/log.txt
CALL_S=${CALL_S:-540}; SERVE_BUDGET=${SERVE_BUDGET:-8192}; BUDGETS=${BUDGETS:-"8192"}
THRESHOLDS=${THRESHOLDS:-"256 0 128 512"}; PROFILE_T=${PROFILE_T:-256}
MODEL=${MODEL:-qwen2-7b}; NAME=$(basename $MODEL); PORT=8011; URL=http://127.0.0.1:$PORT
WORK=${WORK:-"--num-prompts 512 --input-len 100-1024 --output-len 256"}
ENGINE=${ENGINE:-"--max-model-len 4096 --max-num-seqs 256"}
left() { echo $((CALL_S - SECONDS)); }
say() { echo "== $* (t=${SECONDS}s)" | tee -a $LOG; }
finish() {
  python3 - "$R" <<'PY' | tee $OUT/summary.txt
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    try:
        d = json.loads(f.read_text())
    except Exception as exc:
        print(f.name, "unreadable", exc); continue
    if "output_token_throughput" in d:
        s = d.get("server_steps") or {}
        print(f"{f.stem:28s} done {d['completed']}/{d['failed']} {d['duration_s']:7.2f}s out {d['output_token_throughput']:9.1f} tok/s "
              f"TTFT p50/p99 {d['ttft_ms']['p50']}/{d['ttft_ms']['p99']} TPOT p50/p99 {d['tpot_ms']['p50']}/{d['tpot_ms']['p99']} "
              f"ITL p50/p99 {d['itl_ms']['p50']}/{d['itl_ms']['p99']} steps {s}")
    elif "output_tokens_per_s" in d:
        print(f"{f.stem:28s} {d['elapsed_s']:7.2f}s out {d['output_tokens_per_s']:9.1f} tok/s "
              f"roofline {d.get('percent_of_roofline')}% blocks {d['num_kv_blocks']} preempt {d['num_preemptions']}")
PY
  tar czf $OUT/results.tgz -C /tmp results
}
trap finish EXIT
git log --oneline -1 2>/dev/null | tee -a $LOG; echo "commit ${COMMIT:-unknown}" | tee -a $LOG
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee -a $LOG
python3 -c "import torch, triton, zmq, msgspec, fastapi, uvicorn; print(torch.__version__, triton.__version__, zmq.__version__, msgspec.__version__, fastapi.__version__, uvicorn.__version__)" 2>&1 | tee -a $LOG

# 1. Offline: the same 512 requests (token ids below 256, as bench serve draws them), all queued at once.
for B in $BUDGETS; do
  [ $(left) -lt 200 ] && { say "skip offline $B"; continue; }  # the served runs need the rest
  say "offline budget $B"
  timeout 150 python3 scripts/bench/cli.py bench throughput --model $MODEL $WORK $ENGINE --token-id-range 256 \
    --max-num-batched-tokens $B > $R/offline_b$B.json 2> $R/offline_b$B.err
  echo "rc=$? $(grep -h 'roofline:' $R/offline_b$B.err)" | tee -a $LOG
done

# 2. Served: start the server, warm it up (Triton JIT, as offline warms up), run the benchmarks.
serve() {  # name, budget, extra serve flags...
  local name=$1 budget=$2; shift 2
  say "serve $name (budget $budget, $*)"
  python3 -m railyard.cli serve --model $MODEL --port $PORT $ENGINE --max-num-batched-tokens $budget \
    --log-level info "$@" > $R/server_$name.log 2>&1 &
  SERVER=$!
  for i in $(seq 1 150); do curl -sf $URL/health > /dev/null && break; sleep 1; done
  echo "up after ${i}s" | tee -a $LOG
  python3 -m railyard.cli bench serve --url $URL --model $NAME --num-prompts 16 --input-len 100-1024 \
    --output-len 8 --seed 7 > /dev/null 2>&1
}
bench() {  # name, timeout, bench flags...
  local name=$1 t=$2; shift 2
  timeout $t python3 -m railyard.cli bench serve --url $URL --model $NAME $WORK "$@" > $R/$name.json 2> $R/$name.err
  echo "$name rc=$?" | tee -a $LOG
}
stop() {
  kill -INT $SERVER; for i in $(seq 1 40); do kill -0 $SERVER 2>/dev/null || break; sleep 0.5; done
  kill -9 $SERVER 2>/dev/null; wait $SERVER 2>/dev/null
  sleep 2  # the engine process frees the GPU as it exits
}
profile() {  # name: py-spy on the server and its engine process for 12 s, mid-run
  sleep 6
  local front=$SERVER core=$(pgrep -P $SERVER -f spawn_main | head -1)
  timeout 20 py-spy record -p $front -d 12 -r 200 -f raw -o $R/pyspy_${1}_front.txt --nonblocking > /dev/null 2>&1 &
  [ -n "$core" ] && timeout 20 py-spy record -p $core -d 12 -r 200 -f raw -o $R/pyspy_${1}_core.txt --nonblocking > /dev/null 2>&1 &
  wait
}

# The long-prefill cap (one prompt's tokens per step) against ITL at moderate load, then 256 and 64 streams.
for T in $THRESHOLDS; do
  [ $(left) -lt 100 ] && { say "skip threshold $T"; continue; }
  serve proc_b${SERVE_BUDGET}_t$T $SERVE_BUDGET --long-prefill-token-threshold $T
  P=""; if [ "$T" = "$PROFILE_T" ]; then profile proc_b${SERVE_BUDGET}_t$T & P=$!; fi
  bench served_proc_b${SERVE_BUDGET}_t${T}_c256 120 --max-concurrency 256; [ -n "$P" ] && wait $P
  bench served_proc_b${SERVE_BUDGET}_t${T}_poisson8 80 --request-rate 8 --num-prompts 300 --seed 1
  if [ "$T" = "$PROFILE_T" ] && [ $(left) -gt 130 ]; then
    bench served_proc_b${SERVE_BUDGET}_t${T}_c64 60 --max-concurrency 64
  fi
  stop
done
if [ "$PROFILE_T" != none ] && [ $(left) -gt 90 ]; then
  serve inproc_b${SERVE_BUDGET}_t$PROFILE_T $SERVE_BUDGET --long-prefill-token-threshold $PROFILE_T --no-engine-process
  profile inproc_b${SERVE_BUDGET}_t$PROFILE_T & P=$!
  bench served_inproc_b${SERVE_BUDGET}_t${PROFILE_T}_c256 120 --max-concurrency 256; wait $P
  stop
fi
say done
