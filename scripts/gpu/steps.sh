# Sourced by the one-call GPU scripts (fp8.sh, fp8-gemm.sh): a time budget split into steps, and the carried
# wheels. Needs OUT and BUDGET_S set; starts the clock (T0) when sourced.
#   log TEXT...         echo and append to $OUT/log.txt
#   step NAME MAX_S CMD run CMD (a program or an exported function) under timeout min(MAX_S, what is left);
#                       skipped when under 20 s are left, so an early failure or hang costs its own step only
T0=$(date +%s)
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

# railyard's engine needs msgspec (and the server pyzmq): carry .whl where the machine lacks them.
. scripts/gpu/wheels.sh
carried_wheels .whl
