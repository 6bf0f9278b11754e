#!/bin/bash
# BENCHMARKS.md "Cluster layer: placement planner": `railyard plan`'s kube-scheduler simulation over a synthetic
# cluster of 1,000 nodes and 2,000 pods (railyard/cluster/plan_bench.py), timed RUNS times on one CPU core.
#
# Prints the section's JSON on stdout: {"runs": {"1": plan_bench's JSON, ...}, "machine": ...}. Seconds.
#
#   bash scripts/bench/planner-scale.sh           # RUNS=3 NODES=1000 PODS=2000 by default
source "$(dirname "$0")/common.sh"
RUNS=${RUNS:-3}
ARGS=()
for run in $(seq 1 "$RUNS"); do
  python3 -m railyard.cluster.plan_bench --nodes "${NODES:-1000}" --pods "${PODS:-2000}" > "$OUT/plan_bench_$run.json"
  ARGS+=("runs.$run@=$OUT/plan_bench_$run.json")
done
python3 scripts/bench/merge_json.py section="placement planner" commit="$COMMIT" \
  machine="$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), Python $(python3 -V | cut -d' ' -f2)" \
  "${ARGS[@]}" | tee "$OUT/planner-scale.json"
