#!/bin/bash
# BENCHMARKS.md "Serve layer: a burst against Ray Serve's own autoscaling": the same stack and burst trace deployed
# with only the engine deployment's autoscaling policy changed, railyard's pending-requests policy against Ray
# Serve's default (ongoing requests per replica over target_ongoing_requests), in interleaved pairs (ray1, pp1,
# ray2, pp2, ...); the same min/max replicas, target, delays and windows for both. CPU replicas of the embedded
# tiny model behind Ray Serve's proxy (`railyard cluster up`, a Ray start per run); `railyard bench burst` sends
# steady Poisson load, a step to BURST_FACTOR x the rate for BURST_S seconds, and steady again, and reads the
# running replicas from serve.status(). Then scale to zero and back: the stack with min_replicas 0, idle, and one
# request, whose TTFT is its wait for a replica.
#
# Prints the section's JSON on stdout: {"runs": {"ray1": {"policy", "load_avg_before", "burst": the bench burst
# report}, ...}, "summary": per policy the lists over runs of burst_to_new_replica_serving_s, burst_to_scale_up_s,
# burst TTFT p99, failed requests and replica-seconds, "scale_from_zero": bench serve's JSON of the one request}.
# About 2 minutes a run on 2 cores.
#
#   bash scripts/bench/burst-autoscaling.sh    # PAIRS=3 RATE=1 BURST_FACTOR=8 STEADY_S=20 BURST_S=60 AFTER_S=20
source "$(dirname "$0")/common.sh"
PAIRS=${PAIRS:-3}
PORT=${PORT:-8017}
URL=http://127.0.0.1:$PORT
RATE=${RATE:-1} BURST_FACTOR=${BURST_FACTOR:-8} STEADY_S=${STEADY_S:-20} BURST_S=${BURST_S:-60} AFTER_S=${AFTER_S:-20}
INPUT_LEN=${INPUT_LEN:-32-128} OUTPUT_LEN=${OUTPUT_LEN:-64}
MAX_REPLICAS=${MAX_REPLICAS:-2}  # each CPU replica takes one of Ray's logical CPUs (one per core here)
MODEL_DIR=$(python3 -c "from railyard.engine.startup.tiny_model import ensure_tiny_model; print(ensure_tiny_model())")

stack() {  # min_replicas -> a stack file
  cat > "$OUT/stack_min$1.yaml" <<EOF
name: burst
image: railyard:local
models:
  - name: tiny
    model: $MODEL_DIR
    # torch_threads 1: one torch thread per engine, the replicas share few cores
    engine: {max_model_len: 1024, dtype: float32, max_num_seqs: 64, max_num_batched_tokens: 2048, torch_threads: 1}
    autoscaling: {min_replicas: $1, max_replicas: $MAX_REPLICAS, target_pending_per_replica: ${TARGET:-4},
                  upscale_delay_s: ${UPSCALE_DELAY_S:-3}, downscale_delay_s: ${DOWNSCALE_DELAY_S:-20},
                  look_back_period_s: ${LOOK_BACK_S:-5}, metrics_interval_s: ${METRICS_INTERVAL_S:-1}}
EOF
  echo "$OUT/stack_min$1.yaml"
}

up() {  # name policy stack: start `railyard cluster up`, wait until it serves; RAY_GCS is its Ray
  log "$1: railyard cluster up --autoscaling-policy $2"
  python3 -m railyard.cli cluster up -c "$3" --cpu --autoscaling-policy "$2" --port "$PORT" > "$OUT/cluster_$1.log" 2>&1 &
  SERVER=$!
  wait_ready "$OUT/cluster_$1.log" "Ctrl-C to stop"
  RAY_GCS=$(grep -o "Ray at [^)]*" "$OUT/cluster_$1.log" | cut -d' ' -f3)
}

ARGS=()
run() {  # name policy
  local name=$1 policy=$2 load
  up "$name" "$policy" "$(stack 1)"
  load=$(cut -d' ' -f1 /proc/loadavg)
  # RAY_AUTH_MODE=token: Ray joins a token-authenticated cluster (a local one's default) at an explicit address.
  RAY_AUTH_MODE=token timeout 600 python3 -m railyard.cli bench burst --url "$URL" --model tiny --rate "$RATE" \
    --burst-factor "$BURST_FACTOR" --steady-s "$STEADY_S" --burst-s "$BURST_S" --after-s "$AFTER_S" \
    --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" --seed 0 --app burst --deployment engine-tiny-default \
    --ray-address "$RAY_GCS" --plot "$OUT/burst_$name.png" > "$OUT/burst_$name.json" 2> "$OUT/burst_$name.err"
  echo "rc=$?" | tee -a "$OUT/log.txt" >&2
  stop_server
  ARGS+=("runs.$name.policy=$policy" "runs.$name.load_avg_before=$load" "runs.$name.burst@=$OUT/burst_$name.json")
}

for pair in $(seq 1 "$PAIRS"); do
  run "ray$pair" ray_default
  run "pp$pair" pending
done

# Scale to zero and back: deployed idle (no replica), then one request, which waits for a replica to start.
up zero pending "$(stack 0)"
timeout 300 python3 -m railyard.cli bench serve --url "$URL" --model tiny --num-prompts 1 --input-len 64 \
  --output-len 8 > "$OUT/zero.json" 2> "$OUT/zero.err"
stop_server

python3 - "$OUT" "$PAIRS" > "$OUT/summary.json" <<'PY'
import json, sys
out, pairs = sys.argv[1], int(sys.argv[2])
summary = {}
for policy, prefix in (("ray_default", "ray"), ("pending", "pp")):
    rows = {k: [] for k in ("burst_to_new_replica_serving_s", "burst_to_scale_up_s", "burst_ttft_p99_ms", "failed",
                            "replica_seconds")}
    for i in range(1, pairs + 1):
        try:
            r = json.load(open(f"{out}/burst_{prefix}{i}.json"))
        except (OSError, ValueError):
            continue
        rows["burst_to_new_replica_serving_s"].append(r["fleet"]["burst_to_new_replica_serving_s"])
        rows["burst_to_scale_up_s"].append(r["fleet"]["burst_to_scale_up_s"])
        rows["burst_ttft_p99_ms"].append(r["phases"]["burst"]["ttft_p99_ms"])
        rows["failed"].append(r["failed"])
        rows["replica_seconds"].append(r["fleet"]["replica_seconds"])
    summary[policy] = rows
print(json.dumps(summary))
PY
python3 scripts/bench/merge_json.py section="serve layer: a burst against Ray Serve's own autoscaling" commit="$COMMIT" \
  machine="$(nproc) cores, Python $(python3 -V | cut -d' ' -f2), Ray $(python3 -c 'import ray; print(ray.__version__)')" \
  trace="rate $RATE req/s, x$BURST_FACTOR for $BURST_S s after $STEADY_S s, $AFTER_S s after; input $INPUT_LEN, output $OUTPUT_LEN" \
  summary@="$OUT/summary.json" scale_from_zero@="$OUT/zero.json" "${ARGS[@]}" | tee "$OUT/burst-autoscaling.json"
