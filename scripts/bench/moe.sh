#!/bin/bash
# BENCHMARKS.md "Engine: mixtures of experts", one device call: the MoE GPU tests; the offline workload (256 prompts
# of 100-1024 tokens -> 256, EOS ignored, max_num_batched_tokens 16384) on gpt-oss-20b (ROUNDS times, for the
# spread) and qwen3-30b-a3b; gpt-oss-120b started by `railyard serve` and asked one chat completion, then the same
# workload (on a card with room for its 65 GB); HF transformers (the peer) on HF_SHAPES, its static batch the first
# of HF_BATCHES that fits the card's memory.
#
# Prints the section's JSON on stdout; logs, raw JSON and the HF log go to $OUT.
#   bash scripts/bench/moe.sh                           # carry .whl and .peers (a copy of shared/peers/hf_baseline.py)
#   PHASES="offline" SHAPES=gpt-oss-20b ROUNDS=3 bash scripts/bench/moe.sh
#   PHASES="offline" SHAPES=gpt-oss-20b BASELINE=.baseline/tree_COMMIT bash scripts/bench/moe.sh   # carry that too
#   DRY_RUN=1 SKIP_WHEELS=1 bash scripts/bench/moe.sh   # prints what it would run (no GPU needed)
# env: CALL_S (seconds this call may use, default 560), PHASES (default "tests offline serve120b hf"), SHAPES (default
#      "gpt-oss-20b qwen3-30b-a3b"), ROUNDS (gpt-oss-20b's runs, default 2), HF_BATCHES (default "256 64"), HF_SHAPES
#      (the shapes HF runs, default gpt-oss-20b: qwen3-30b-a3b's HF run takes ~250 s on an H200, a call of its own),
#      HF_BUDGET_S (default 300), TESTS_S (the GPU tests' limit, default 320: on a fresh machine they compile every
#      kernel variant, both MXFP4 byte orders among them, and take over 3 minutes; then run "tests" and "offline" in
#      separate calls), BASELINE (a directory holding another checkout's railyard/: each offline run is followed by
#      the same run from it, the code before a change in the same call), COMMIT (the label the log and JSON carry;
#      pass it on the GPU machine, whose copy of the tree may carry another checkout's git metadata)
source "$(dirname "$0")/common.sh"
. scripts/device/wheels.sh
carried_wheels .whl > "$OUT/pip.txt" 2>&1 || { tail -n 3 "$OUT/pip.txt"; log "wheel install failed"; exit 1; }
CALL_S=${CALL_S:-560}; PHASES=${PHASES:-"tests offline serve120b hf"}
SHAPES=${SHAPES:-"gpt-oss-20b qwen3-30b-a3b"}; ROUNDS=${ROUNDS:-2}
HF_BATCHES=${HF_BATCHES:-"256 64"}; HF_SHAPES=${HF_SHAPES:-gpt-oss-20b}
HF_BUDGET_S=${HF_BUDGET_S:-300}; TESTS_S=${TESTS_S:-320}
WORK="--num-prompts 256 --input-len 100-1024 --output-len 256 --max-num-batched-tokens 16384"
PEER=$(ls .peers/hf_baseline.py shared/peers/hf_baseline.py 2>/dev/null | head -n 1)
left() { echo $((CALL_S - SECONDS)); }
want() { [[ " $PHASES " == *" $1 "* ]] && [ "$(left)" -ge "$2" ] || { log "skip $1 ($(left) s left)"; return 1; }; }
run() { if [ -n "${DRY_RUN:-}" ]; then echo "would run: $*" >&2; else "$@"; fi; }
ARGS=()
[ -z "${DRY_RUN:-}" ] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
log "commit $COMMIT; $(cat "$OUT/gpu.txt" 2>/dev/null)"

if want tests 150; then
  run timeout "$TESTS_S" python3 -m pytest -q -p no:cacheprovider tests/engine/runner/kernels/test_fused_moe.py \
    tests/engine/runner/kernels/test_mxfp4_widen.py tests/engine/runner/kernels/test_moe_routing.py \
    tests/engine/runner/layers/test_moe.py tests/engine/test_gpt_oss.py > "$OUT/tests.txt" 2>&1
  log "tests rc=$? $(tail -n 1 "$OUT/tests.txt" 2>/dev/null)"
  tail -n 1 "$OUT/tests.txt" > "$OUT/tests_summary.txt" 2>/dev/null
  ARGS+=("tests#=$OUT/tests_summary.txt")
fi

bench() {  # KEY MODEL [FLAG...]: the offline workload into $OUT/bench_KEY.json; with FROM (a checkout holding
  #          railyard/), from that code instead, into $OUT/baseline_KEY.json
  local name=bench key=railyard tree=. cli=scripts/bench/cli.py
  if [ -n "${FROM:-}" ]; then  # cli.py imports the checkout it lies in
    name=baseline; key=baseline; tree=$FROM; cli="-m railyard.cli"
  fi
  log "bench throughput $2 ($1)${FROM:+ from $FROM}"
  (cd "$tree" && PYTHONPATH=/tmp/site:$PWD run timeout 200 python3 $cli bench throughput --model "$2" $WORK "${@:3}" \
    > "$OUT/${name}_$1.json" 2> "$OUT/${name}_$1.err")
  log "rc=$? $(grep -h "roofline:" "$OUT/${name}_$1.err" 2>/dev/null | tail -n 1)"
  ARGS+=("$key.$1@=$OUT/${name}_$1.json")
}
for shape in $SHAPES; do
  rounds=1; [ "$shape" = gpt-oss-20b ] && rounds=$ROUNDS
  for round in $(seq 1 "$rounds"); do
    want offline 150 && bench "${shape}_$round" "$shape"
    [ -n "${BASELINE:-}" ] && want offline 150 && FROM=$BASELINE bench "${shape}_$round" "$shape"
  done
done

if want serve120b 240; then
  log "railyard serve --model gpt-oss-120b"
  if [ -n "${DRY_RUN:-}" ]; then
    run python3 -m railyard.cli serve --model gpt-oss-120b --port 8011
  else
    started=$SECONDS
    (exec python3 scripts/bench/cli.py serve --model gpt-oss-120b --port 8011 --log-level info) > "$OUT/serve120b.log" 2>&1 &
    SERVER=$!
    ready=null
    for _ in $(seq 1 240); do
      if curl -sf localhost:8011/health > /dev/null; then ready=$((SECONDS - started)); break; fi
      kill -0 "$SERVER" 2>/dev/null || break
      sleep 1
    done
    if [ "$ready" != null ]; then
      curl -s localhost:8011/v1/chat/completions -H 'content-type: application/json' -d '{"model": "gpt-oss-120b",
        "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 24}' > "$OUT/chat120b.json"
    fi
    log "gpt-oss-120b ready after ${ready} s; $(head -c 300 "$OUT/chat120b.json" 2>/dev/null)"
    echo "$ready" > "$OUT/ready120b.txt"
    stop_server
    ARGS+=("gpt_oss_120b.ready_s#=$OUT/ready120b.txt" "gpt_oss_120b.chat@=$OUT/chat120b.json")
  fi
  # 8,192 tokens of context: an 80 GB card keeps ~2 GiB of KV beside the 61 GiB of weights, under its 131,072
  want serve120b 200 && bench gpt-oss-120b gpt-oss-120b --max-model-len 8192
fi

if [ -n "$PEER" ]; then
  # The peer's static batch is 256; where that runs out of memory, a copy with the next of HF_BATCHES runs
  for hf_shape in $HF_SHAPES; do
    for batch in $HF_BATCHES; do
      want hf 120 || break
      sed "s/for batch in (256,):/for batch in ($batch,):/" "$PEER" > "$OUT/hf_baseline_b$batch.py"
      budget=$(($(left) - 30 < HF_BUDGET_S ? $(left) - 30 : HF_BUDGET_S))
      log "HF transformers $hf_shape, static batch $batch (budget $budget s)"
      SHAPES=$hf_shape OUT="$OUT" BUDGET_S=$budget run timeout $((budget + 30)) \
        python3 "$OUT/hf_baseline_b$batch.py" > "$OUT/hf_${hf_shape}_b$batch.log" 2>&1
      rc=$?
      [ -f "$OUT/hf_baseline.json" ] && mv "$OUT/hf_baseline.json" "$OUT/hf_${hf_shape}_b$batch.json"
      log "rc=$rc $(grep -h '^{' "$OUT/hf_${hf_shape}_b$batch.log" 2>/dev/null | cut -c1-200 | head -n 1)"
      ARGS+=("hf.$hf_shape.b$batch@=$OUT/hf_${hf_shape}_b$batch.json")
      grep -q "\"hf_static_b$batch\"" "$OUT/hf_${hf_shape}_b$batch.json" 2>/dev/null && break
    done
  done
fi

python3 scripts/bench/merge_json.py section="mixtures of experts" commit="$COMMIT" \
  workload="256 prompts 100-1024 tokens (seed 0), 256 output tokens, EOS ignored, greedy, max_num_batched_tokens 16384" \
  gpu#="$OUT/gpu.txt" "${ARGS[@]}" | tee "$OUT/moe.json"
