#!/bin/bash
# BENCHMARKS.md "Serve layer: routing on Ray Serve": the same stack and trace deployed with only the engine
# deployments' request router changed, railyard's pending_prefix against round_robin, in interleaved pairs
# (rr1, pp1, rr2, pp2, ...). Two CPU replicas of the embedded tiny model (railyard/serve/stacks/tiny-cpu.yaml)
# behind Ray Serve's proxy; the mixed trace: Poisson 8 req/s, each prompt one of 7 shared 256-token prefixes
# plus 16-512 random tokens, 16-256 output tokens (EOS ignored).
#
# Prints the section's JSON on stdout: {"runs": {"rr1": {"router", "load_avg_before", "bench": bench serve
# JSON, "metrics": prefix-cache tokens and routing decisions from /metrics}, ...}}. About 12 minutes on 2 cores (a Ray start per run).
#
#   bash scripts/bench/routing-on-ray-serve.sh    # PAIRS=3 NUM_PROMPTS=96 PORT=8000 by default
source "$(dirname "$0")/common.sh"
PAIRS=${PAIRS:-3}
PORT=${PORT:-8000}
URL=http://127.0.0.1:$PORT
STACK=railyard/serve/stacks/tiny-cpu.yaml
python3 -c "from railyard.engine.startup.tiny_model import ensure_tiny_model; ensure_tiny_model()"  # the stack's model

ARGS=()
run() {  # name router
  local name=$1 router=$2
  log "$name: railyard cluster up --router $router"
  python3 -m railyard.cli cluster up -c "$STACK" --cpu --router "$router" --port "$PORT" > "$OUT/cluster_$name.log" 2>&1 &
  SERVER=$!
  wait_ready "$OUT/cluster_$name.log" "Ctrl-C to stop"
  local load
  load=$(cut -d' ' -f1 /proc/loadavg)
  timeout 300 python3 -m railyard.cli bench serve --url "$URL" --model tiny --num-prompts "${NUM_PROMPTS:-96}" \
    --input-len 16-512 --output-len 16-256 --prefix-groups 7 --shared-prefix-len 256 --request-rate 8 --seed 0 \
    > "$OUT/bench_$name.json" 2> "$OUT/bench_$name.err"
  echo "rc=$?" | tee -a "$OUT/log.txt" >&2
  curl -s "$URL/metrics" > "$OUT/metrics_$name.txt"
  python3 scripts/bench/prefix_metrics.py "$OUT/metrics_$name.txt" > "$OUT/metrics_$name.json"
  stop_server
  ARGS+=("runs.$name.router=$router" "runs.$name.load_avg_before=$load" "runs.$name.bench@=$OUT/bench_$name.json"
         "runs.$name.metrics@=$OUT/metrics_$name.json")
}

for pair in $(seq 1 "$PAIRS"); do
  run "rr$pair" round_robin
  run "pp$pair" pending_prefix
done
python3 scripts/bench/merge_json.py section="serve layer: routing on Ray Serve" commit="$COMMIT" \
  machine="$(nproc) cores, Python $(python3 -V | cut -d' ' -f2), Ray $(python3 -c 'import ray; print(ray.__version__)')" \
  "${ARGS[@]}" | tee "$OUT/routing-on-ray-serve.json"
