#!/bin/bash
# Issue 14 on one H200 (one device call, ~5-8 minutes): structured-outputs overhead on the qwen2-7b shape served by
# `railyard serve` and loaded by `railyard bench serve` (streamed /v1/completions, token-id prompts, greedy,
# ignore_eos). Output tok/s with every request under one JSON schema against unconstrained, at 64 and 256 in
# flight; and the TTFT a first-seen schema (compile) and a cached one add, one request at a time.
# Two tokenizers: the embedded 259-token byte-level one (the shape's default: its ids < 259 inside the model's
# 152,064-token vocabulary, so the masks are full width but the grammar sees bytes), then a ~100k-token byte-level
# BPE trained here on Python sources (scripts/bench/bpe_tokenizer.py): compile and mask costs of a real vocabulary.
# Per phase: an untimed warm-up of both modes at each concurrency (new batch shapes, kernels' JIT), then REPS
# (default 3) timed repetitions in alternating order (plain then json, json then plain, ...); summary.json has
# the median, min and max tok/s per mode and the overhead of the medians (and of each adjacent pair) per concurrency.
#
# Run (carry .whl holding xgrammar 0.2.9 + apache-tvm-ffi, besides the serve wheels of calls 2-3):
#   bash scripts/bench/structured-outputs.sh
# Knobs: REPS (3), CALL_S (420: phase 2 starts only with 150 s left), SKIP_BPE=1 (phase 1 only), PORT,
# OLD_TREE=<dir>: the byte-level phase again with the code in <dir> (a checkout with railyard/ and scripts/, inside
# the repo and carried, e.g. `git archive <rev> railyard scripts | tar -x -C .old`), after this tree's, for a
# before/after in the same call (its results are tagged `old`).
# Back in $OUT: summary.json (the numbers), log.txt (progress and the table), serve_*.log (servers' tails), bpe.log.
# CPU dry run of the same steps: MODEL=<tiny checkpoint dir> SMALL=1 bash scripts/bench/structured-outputs.sh
set -o pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/so-out}; mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/so.XXXX)
MODEL=${MODEL:-qwen2-7b}
BUDGET_S=${CALL_S:-420}  # phase 2 (the BPE tokenizer) starts only if this much time is left for it
PORT=${PORT:-8011}
log() { echo "== $(date +%T) +${SECONDS}s $*" | tee -a "$OUT/log.txt"; }

. scripts/device/wheels.sh
carried_wheels .whl  # a failure shows as the missing packages below
python3 -c "import xgrammar, fastapi, uvicorn, pydantic" 2>> "$OUT/log.txt" \
  || { log "missing packages: carry .whl with xgrammar, apache-tvm-ffi and the serve wheels"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null | tee -a "$OUT/log.txt"

if [ -n "$SMALL" ]; then  # CPU dry run: tiny sizes
  C_LOW=4; C_HIGH=8; IN=16-48; OUT_LEN=24; REPS=${REPS:-2}; TTFT_N=4; BPE_MB=4; SERVE_ARGS="--max-model-len 1024"
else
  C_LOW=64; C_HIGH=256; IN=128-512; OUT_LEN=128; REPS=${REPS:-3}; TTFT_N=24; BPE_MB=64
  SERVE_ARGS="--max-num-batched-tokens 8192 --max-model-len 4096"
fi
# Every request's constraint: records of typed fields (integers, bounded strings, numbers, enum arrays). minItems
# keeps any output from completing within the output length, so every request makes exactly OUT_LEN tokens.
SCHEMA='{"json": {"type": "object", "properties": {"items": {"type": "array", "minItems": 200, "items": {
  "type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string", "maxLength": 16},
  "score": {"type": "number"}, "tags": {"type": "array", "items": {"enum": ["alpha", "beta", "gamma"]},
  "maxItems": 3}}, "required": ["id", "name", "score", "tags"]}}}, "required": ["items"]}}'

# The BPE tokenizer trains while the first server loads (on part of the cores); it must finish before measuring.
# SKIP_BPE=1: phase 1 only (a short call).
BPE=
if [ -z "$SKIP_BPE" ]; then
  RAYON_NUM_THREADS=8 python3 scripts/bench/bpe_tokenizer.py "$WORK/bpe" --max-mb "$BPE_MB" > "$OUT/bpe.log" 2>&1 &
  BPE=$!
fi

SERVER=
TREE=$PWD  # the code the server runs (OLD_TREE's phase switches it)
start_server() {  # tag, extra serve args
  PYTHONPATH=/tmp/site:$TREE python3 "$TREE/scripts/bench/cli.py" serve --model "$MODEL" --port $PORT $SERVE_ARGS "${@:2}" \
    > "$WORK/serve_$1.log" 2>&1 &
  SERVER=$!
  for i in $(seq 1 240); do
    curl -sf http://127.0.0.1:$PORT/health > /dev/null && break
    kill -0 $SERVER 2> /dev/null || break
    sleep 1
  done
  NAME=$(curl -s http://127.0.0.1:$PORT/v1/models | python3 -c "import json,sys; print(json.load(sys.stdin)['data'][0]['id'])")
  log "server $1 up serving '$NAME' (pid $SERVER)"
  [ -n "$NAME" ]
}
stop_server() {  # tag: Ctrl-C, as a user stops it; the engine process frees the GPU as it exits
  kill -INT $SERVER 2> /dev/null
  for i in $(seq 1 40); do kill -0 $SERVER 2> /dev/null || break; sleep 0.5; done
  kill -9 $SERVER 2> /dev/null; wait $SERVER 2> /dev/null
  sleep 2
  grep -v -i "warn" "$WORK/serve_$1.log" | tail -n 30 > "$OUT/serve_$1.log"
}
bench() {  # result name, concurrency, prompts, input len, output len, extra args
  timeout 150 python3 scripts/bench/cli.py bench serve --url http://127.0.0.1:$PORT --model "$NAME" --max-concurrency $2 \
    --num-prompts $3 --input-len $4 --output-len $5 --seed 1 "${@:6}" > "$WORK/$1.json" 2> "$WORK/$1.err"
  python3 -c "import json; r=json.load(open('$WORK/$1.json')); print('$1', r['completed'], r['failed'], \
round(r['output_token_throughput']), r['ttft_ms']['p50'], r['errors'][:1])" 2>&1 | tee -a "$OUT/log.txt"
}
bench_mode() {  # plain | json, then bench's arguments
  if [ "$1" = json ]; then bench "${@:2}" --structured-outputs "$SCHEMA"; else bench "${@:2}"; fi
}
phase() {  # tag (byte | bpe | old), repetitions, ttft (1: the one-at-a-time TTFT runs too)
  bench "$1_warm_plain" 16 32 64 8
  bench "$1_warm_json" 16 32 64 8 --structured-outputs "$SCHEMA"  # TokenizerInfo, compile, the mask kernel's JIT
  bench "$1_warm_one" 1 2 64 8 --structured-outputs "$SCHEMA"  # the kernel's JIT for a one-row batch
  for c in $C_LOW $C_HIGH; do  # untimed: every batch size and prefill shape of the timed runs, both modes
    bench "$1_warm_plain_c$c" $c $c $IN 32
    bench "$1_warm_json_c$c" $c $c $IN 32 --structured-outputs "$SCHEMA"
  done
  for rep in $(seq 1 $2); do
    order="plain json"; [ $((rep % 2)) -eq 0 ] && order="json plain"  # alternating: neither mode always goes first
    for c in $C_LOW $C_HIGH; do
      for mode in $order; do
        bench_mode $mode "$1_${mode}_c${c}_r$rep" $c $((c * 3)) $IN $OUT_LEN
      done
    done
  done
  [ "$3" = 1 ] || return 0
  # TTFT one request at a time: no constraint, the (compiled) schema again, a new schema every request
  bench "$1_ttft_plain" 1 $TTFT_N 256 4
  bench "$1_ttft_cached" 1 $TTFT_N 256 4 --structured-outputs "$SCHEMA"
  bench "$1_ttft_first_seen" 1 $TTFT_N 256 4 --structured-outputs "$SCHEMA" --unique-schemas
}

log "phase 1: $MODEL, embedded byte-level tokenizer"
if start_server byte; then
  [ -n "$BPE" ] && { wait $BPE; log "bpe tokenizer: $(tail -n 1 "$OUT/bpe.log")"; }
  phase byte $REPS 1
fi
stop_server byte
if [ -n "$OLD_TREE" ]; then
  if [ -f "$OLD_TREE/scripts/bench/cli.py" ]; then
    TREE=$(cd "$OLD_TREE" && pwd)
    log "phase 1 again with the code in $OLD_TREE (tagged old)"
    start_server old && phase old $REPS 0
    stop_server old
    TREE=$PWD
  else
    log "OLD_TREE=$OLD_TREE has no scripts/bench/cli.py: skipped"
  fi
fi
[ -n "$BPE" ] && wait $BPE 2> /dev/null
if [ $((BUDGET_S - SECONDS)) -gt 150 ] && [ -f "$WORK/bpe/tokenizer.json" ]; then
  log "phase 2: $MODEL, trained BPE tokenizer"
  if start_server bpe --tokenizer "$WORK/bpe"; then
    phase bpe $REPS 1
  fi
  stop_server bpe
else
  log "phase 2 skipped: $((BUDGET_S - SECONDS)) s left or no BPE tokenizer"
fi

python3 - "$WORK" "$OUT/summary.json" <<'EOF' 2>&1 | tee -a "$OUT/log.txt"
import glob, json, os, statistics, sys
work, out = sys.argv[1], sys.argv[2]
runs = {}
for path in glob.glob(os.path.join(work, "*.json")):
    try:
        runs[os.path.basename(path)[:-5]] = json.load(open(path))
    except ValueError:
        pass
summary = {"runs": {k: {f: r[f] for f in ("completed", "failed", "output_token_throughput", "duration_s",
                                          "ttft_ms", "tpot_ms", "errors")} for k, r in sorted(runs.items())}}
def stats(values):
    return {"median": round(statistics.median(values)), "min": round(min(values)), "max": round(max(values)),
            "n": len(values)}

for tok in ("byte", "old", "bpe"):
    for c in sorted({int(k.split("_c")[1].split("_")[0]) for k in runs if k.startswith(f"{tok}_plain_c")}):
        by_rep = {mode: {k.rsplit("_r", 1)[1]: r["output_token_throughput"] for k, r in runs.items()
                         if k.startswith(f"{tok}_{mode}_c{c}_r") and not r["failed"]} for mode in ("plain", "json")}
        plain, json_ = list(by_rep["plain"].values()), list(by_rep["json"].values())
        if plain and json_:
            p, j = statistics.median(plain), statistics.median(json_)
            pairs = [100 * (by_rep["plain"][r] - by_rep["json"][r]) / by_rep["plain"][r]
                     for r in sorted(by_rep["plain"]) if r in by_rep["json"]]
            summary[f"{tok}_c{c}"] = {"plain_tok_s": stats(plain), "json_tok_s": stats(json_),
                                      "overhead_pct": round(100 * (p - j) / p, 1),
                                      "overhead_pct_per_rep": [round(x, 1) for x in pairs]}
    t = {k: runs.get(f"{tok}_ttft_{k}") for k in ("plain", "cached", "first_seen")}
    if all(v and not v["failed"] for v in t.values()):
        summary[f"{tok}_ttft_ms"] = {k: {"p50": v["ttft_ms"]["p50"], "mean": v["ttft_ms"]["mean"]} for k, v in t.items()}
        summary[f"{tok}_ttft_ms"]["added_p50"] = {k: round(t[k]["ttft_ms"]["p50"] - t["plain"]["ttft_ms"]["p50"], 1)
                                                  for k in ("cached", "first_seen")}
json.dump(summary, open(out, "w"), indent=1)
for k, v in summary.items():
    if k != "runs":
        print(k, json.dumps(v))
EOF
log "done"
