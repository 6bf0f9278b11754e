#!/bin/bash
# The Ray Serve path's streaming overhead on CPU: the same tiny-model engine served directly (`railyard serve`)
# and behind Ray Serve's HTTP proxy (`railyard cluster up --cpu`, one replica, same engine options), the same
# streamed `railyard bench serve` against each, in interleaved runs (direct1, ray1, direct2, ray2, ...). Many
# output tokens and 64 concurrent streams, so the stream-item rate (not the engine) decides the Ray path.
# Ray runs in a private temp dir; each Ray start costs ~20 s on 2 cores.
#
# STREAM_INTERVAL_S sets the model's stream_interval_s in the stack (unset: the serve layer's default). On 2
# cores the engine shares the CPU with the Ray processes and slows to ~20 tokens/s per stream behind Ray, so
# at the default 0.05 s few outputs merge; the GPU engine runs ~10x faster per stream.
#
# STREAM_ITEMS_PER_S sets stream_items_per_s (0: the fixed interval only, the setting before the budget) and
# INGRESS_REPLICAS the stack's ingress.num_replicas (unset: the serve layer's defaults). DIRECT=0 skips the direct
# runs. Ray's own throughput mode is an environment of every Ray process: RAY_SERVE_THROUGHPUT_OPTIMIZED=1 (and
# RAY_SERVE_ENABLE_DIRECT_INGRESS=0, to keep the proxy) in this script's environment reaches them all.
#
# Prints {"runs": {"direct1": bench serve JSON, "ray1": ..., ...}} on stdout (scripts/merge_json.py: null for a run
# whose JSON is missing, the reason on stderr).
#   bash scripts/cpu/ray-stream-overhead.sh    # RUNS=2 CONCURRENCY=64 NUM_PROMPTS=128 OUTPUT_LEN=256
source "$(dirname "$0")/../common.sh"
RUNS=${RUNS:-2}
PORT=${PORT:-8031}
URL=http://127.0.0.1:$PORT
CONCURRENCY=${CONCURRENCY:-64} NUM_PROMPTS=${NUM_PROMPTS:-128} INPUT_LEN=${INPUT_LEN:-32} OUTPUT_LEN=${OUTPUT_LEN:-256}
export RAILYARD_TORCH_THREADS=1 RAY_TMPDIR=${RAY_TMPDIR:-/tmp/ray-rso-$$}
mkdir -p "$RAY_TMPDIR"
MODEL_DIR=$(python3 -c "from railyard.engine.startup.tiny_model import ensure_tiny_model; print(ensure_tiny_model())")
ENGINE="max_model_len: 1024, dtype: float32, max_num_seqs: $CONCURRENCY, max_num_batched_tokens: 2048"
cat > "$OUT/stack.yaml" <<YAML
name: rso
image: railyard:local
models:
  - name: tiny
    model: $MODEL_DIR
    num_replicas: 1
    engine: {$ENGINE}
YAML
[ -n "${STREAM_INTERVAL_S:-}" ] && echo "    stream_interval_s: $STREAM_INTERVAL_S" >> "$OUT/stack.yaml"
[ -n "${STREAM_ITEMS_PER_S:-}" ] && echo "    stream_items_per_s: $STREAM_ITEMS_PER_S" >> "$OUT/stack.yaml"
[ -n "${INGRESS_REPLICAS:-}" ] && printf 'ingress:\n  num_replicas: %s\n' "$INGRESS_REPLICAS" >> "$OUT/stack.yaml"

bench() {  # name
  timeout 300 python3 -m railyard.cli bench serve --url "$URL" --model tiny --num-prompts "$NUM_PROMPTS" \
    --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" --max-concurrency "$CONCURRENCY" --seed 0 \
    > "$OUT/bench_$1.json" 2> "$OUT/bench_$1.err"
  echo "$1 rc=$?" | tee -a "$OUT/log.txt" >&2
  ARGS+=("runs.$1@=$OUT/bench_$1.json")
}

ARGS=()
for run in $(seq 1 "$RUNS"); do
  if [ "${DIRECT:-1}" != 0 ]; then
    log "direct$run"
    python3 -m railyard.cli serve --model "$MODEL_DIR" --served-model-name tiny --device cpu --dtype float32 \
      --max-model-len 1024 --max-num-seqs "$CONCURRENCY" --max-num-batched-tokens 2048 --port "$PORT" \
      > "$OUT/direct$run.log" 2>&1 &
    SERVER=$!
    wait_ready "$OUT/direct$run.log" "OpenAI API under" && bench "direct$run"
    stop_server
  fi
  log "ray$run"
  python3 -m railyard.cli cluster up -c "$OUT/stack.yaml" --cpu --port "$PORT" > "$OUT/ray$run.log" 2>&1 &
  SERVER=$!
  wait_ready "$OUT/ray$run.log" "Ctrl-C to stop" && bench "ray$run"
  stop_server
done
python3 scripts/merge_json.py "${ARGS[@]}"
