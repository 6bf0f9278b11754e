# Sourced by the one-call GPU scripts (scripts/bench/fp8.sh, scripts/dev/startup-profile.sh): a time budget split into steps, the
# run's header and `bench throughput` runs, and the carried wheels. Needs OUT and BUDGET_S set; when sourced it
# starts the clock (T0), makes $OUT with a fresh log.txt (and no bench_logs.txt from an earlier run) and BENCH_TMP,
# a scratch folder removed on exit.
#   log TEXT...         echo and append to $OUT/log.txt
#   step NAME MAX_S CMD run CMD (a program or an exported function) under timeout min(MAX_S, what is left);
#                       skipped when under 20 s are left, so an early failure or hang costs its own step only
#   header              the GPU, commit and versions -> log.txt
#   bench VARIANT FLAGS `bench throughput` $WORKLOAD FLAGS -> $BENCH_TMP/VARIANT.json
T0=$(date +%s)
mkdir -p "$OUT"
: > "$OUT/log.txt"
rm -f "$OUT/bench_logs.txt"
BENCH_TMP=$(mktemp -d)
export BENCH_TMP
trap 'rm -rf "$BENCH_TMP"' EXIT
log() { echo "$*" | tee -a "$OUT/log.txt"; }
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
step() {
  local name=$1 max=$2; shift 2
  local l; l=$(left)
  if (( l < 20 )); then log "== $name SKIPPED (budget spent)"; return 0; fi
  local t=$(( max < l ? max : l ))
  log "== $name (timeout ${t}s) $(date +%T)"
  local s; s=$(date +%s)
  timeout "$t" bash -c '"$@"' _ "$@"
  local rc=$?
  log "   $name rc=$rc in $(( $(date +%s) - s ))s"
  return 0
}
export -f log

# header: the GPU (not in a DRY_RUN), the commit ($COMMIT, and the copied .git's), the torch and triton versions -> log.txt.
header() {
  [ -z "$DRY_RUN" ] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$OUT/log.txt"
  # The device's checkout is the working tree; its .git may lag behind, so $COMMIT (what the caller says it ran)
  # is the record, and git's line is what the copied .git says.
  echo "COMMIT=${COMMIT:-unset}; the copied .git says: $(git log --oneline -1 2>/dev/null | cut -c1-80)" | tee -a "$OUT/log.txt"
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
    | tee -a "$OUT/log.txt"
}

# bench VARIANT FLAGS...: `bench throughput` $WORKLOAD FLAGS -> $BENCH_TMP/VARIANT.json (its log VARIANT.err);
# the start-up and roofline lines -> log.txt, the log's tail -> bench_logs.txt (scripts/bench/fp8.sh).
bench() {
  local variant=$1; shift
  python3 scripts/bench/cli.py bench throughput $WORKLOAD "$@" > "$BENCH_TMP/$variant.json" 2> "$BENCH_TMP/$variant.err"
  local rc=$?
  grep -h "memory profile\|engine ready\|GEMMs:\|roofline:\|Error\|error:" "$BENCH_TMP/$variant.err" | cut -c1-300 \
    | tee -a "$OUT/log.txt"
  { echo "## $variant (rc=$rc)"; tail -n 25 "$BENCH_TMP/$variant.err"; } >> "$OUT/bench_logs.txt"
  return $rc
}
export -f bench

# railyard's engine needs msgspec (and the server pyzmq): carry .whl where the machine lacks them.
. scripts/device/wheels.sh
carried_wheels .whl
