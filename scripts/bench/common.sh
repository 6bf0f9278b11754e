# Sourced by every reproduction script: the repository root as working directory, $OUT, $COMMIT, `log`, and
# `stop_server` for the one background server a script may hold in $SERVER (stopped on exit, whatever happens).
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-/tmp/railyard-out}
mkdir -p "$OUT"
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
SERVER=

log() { echo "== $* $(date +%T)" | tee -a "$OUT/log.txt" >&2; }

stop_server() {  # SIGTERM first (railyard serve and cluster up clean up on it; a background job of a script
  # ignores SIGINT, so Ctrl-C's signal would only wait for the KILL), then the hard way
  [ -z "$SERVER" ] && return
  kill -TERM "$SERVER" 2>/dev/null
  for _ in $(seq 1 60); do kill -0 "$SERVER" 2>/dev/null || break; sleep 1; done
  kill -KILL "$SERVER" 2>/dev/null
  wait "$SERVER" 2>/dev/null
  SERVER=
}
trap stop_server EXIT

wait_ready() {  # LOG PATTERN: wait (up to 300 s) until the server in $SERVER has written PATTERN to LOG; 1 if it
  # exited or never did
  for _ in $(seq 1 300); do
    grep -q "$2" "$1" && return 0
    kill -0 "$SERVER" 2>/dev/null || return 1
    sleep 1
  done
  return 1
}
