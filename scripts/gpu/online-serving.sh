#!/bin/bash
# BENCHMARKS.md "Front: online serving" and "Online: railyard serve + railyard bench serve, 256 concurrent
# streams": the OpenAI server (`railyard serve`, one engine) loaded over HTTP by `railyard bench serve`
# (streamed /v1/completions, seeded token-id prompts, ignore_eos, greedy), client and server on one host,
# the qwen2-7b shape with random bf16 weights; and, for scale, the same engine offline on the first load.
#
#   server --max-model-len 4096:          64 in flight (400 prompts 128-1024 -> 128), Poisson 8 req/s (300)
#   offline bench throughput, same flags: 400 prompts at 64 sequences per batch
#   server --max-num-batched-tokens 8192: 256 in flight (512 prompts 100-1024 -> 256)
#
# Prints the sections' JSON on stdout: {"runs": {name: {"server": flags, "bench": bench serve JSON}}, ...};
# server logs, /metrics after each server's loads and raw files go to $OUT. About 5 minutes on one H200.
#
#   bash scripts/gpu/online-serving.sh          # carry .whl if the machine lacks the server's wheels
#   SMOKE=1 bash scripts/gpu/online-serving.sh  # the script's plumbing on a CPU: tiny model, 8 prompts per load
source "$(dirname "$0")/../common.sh"
MODEL=${MODEL:-qwen2-7b}
PORT=${PORT:-8011}
URL=http://127.0.0.1:$PORT
SERVER_EXTRA=()
LOAD_EXTRA=()
if [ -n "${SMOKE:-}" ]; then
  MODEL=$(python3 -c "from railyard.engine.tiny_model import ensure_tiny_model; print(ensure_tiny_model())")
  SERVER_EXTRA=(--device cpu --max-model-len 512 --max-num-seqs 64)
  LOAD_EXTRA=(--num-prompts 8 --input-len 16-64 --output-len 8)
fi
if ls .whl/*.whl > /dev/null 2>&1; then  # wheels the GPU machine lacks (fastapi, uvicorn, ...)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

ARGS=()
serve() {  # name, then `railyard serve` flags
  local name=$1; shift
  log "railyard serve $name: $*"
  python3 scripts/gpu/cli.py serve --model "$MODEL" --port "$PORT" "$@" "${SERVER_EXTRA[@]}" > "$OUT/serve_$name.log" 2>&1 &
  SERVER=$!
  SERVER_FLAGS="$*"
  for i in $(seq 1 300); do
    curl -sf "$URL/health" > /dev/null 2>&1 && break
    kill -0 "$SERVER" 2>/dev/null || break
    sleep 1
  done
  SERVED=$(curl -sf "$URL/v1/models" | python3 -c "import json,sys; print(json.load(sys.stdin)['data'][0]['id'])")
  echo "server $name up after ${i}s serving ${SERVED:-nothing}" | tee -a "$OUT/log.txt" >&2
  grep -i "memory profile\|engine ready" "$OUT/serve_$name.log" | tee -a "$OUT/log.txt" >&2
}
load() {  # name, then `railyard bench serve` flags
  local name=$1; shift
  log "railyard bench serve $name: $*"
  timeout 300 python3 scripts/gpu/cli.py bench serve --url "$URL" --model "${SERVED:-$MODEL}" "$@" "${LOAD_EXTRA[@]}" \
    > "$OUT/$name.json" 2> "$OUT/$name.err"
  echo "rc=$?" | tee -a "$OUT/log.txt" >&2
  grep -v -i warn "$OUT/$name.err" | tail -n 12 | tee -a "$OUT/log.txt" >&2
  ARGS+=("runs.$name.server=railyard serve --model $MODEL $SERVER_FLAGS" "runs.$name.load=$*"
         "runs.$name.bench@=$OUT/$name.json")
}

serve max-model-len-4096 --max-model-len 4096
load 64-in-flight --input-len 128-1024 --output-len 128 --num-prompts 400 --max-concurrency 64
load poisson-8 --input-len 128-1024 --output-len 128 --num-prompts 300 --request-rate 8 --seed 1
curl -s "$URL/metrics" > "$OUT/metrics_max-model-len-4096.txt"
stop_server

log "offline reference: railyard bench throughput, the first load's prompts queued at once"
timeout 240 python3 scripts/gpu/cli.py bench throughput --model "$MODEL" --num-prompts 400 --input-len 128-1024 \
  --output-len 128 --max-num-seqs 64 --max-model-len 4096 "${SERVER_EXTRA[@]}" "${LOAD_EXTRA[@]}" \
  > "$OUT/offline-64-seqs.json" 2> "$OUT/offline-64-seqs.err"
echo "rc=$?" | tee -a "$OUT/log.txt" >&2
ARGS+=("offline_reference@=$OUT/offline-64-seqs.json")

serve budget-8192 --max-num-batched-tokens 8192
load 256-in-flight --num-prompts 512 --input-len 100-1024 --output-len 256 --max-concurrency 256
curl -s "$URL/metrics" > "$OUT/metrics_budget-8192.txt"
stop_server

python3 scripts/merge_json.py section="online serving: railyard serve + railyard bench serve" commit="$COMMIT" \
  model="$MODEL" "${ARGS[@]}" | tee "$OUT/online-serving.json"
