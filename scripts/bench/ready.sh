#!/bin/bash
# Ready at full speed, one device call on the H200: (1) the GPU test that a workload across the engine's limits
# compiles no Triton kernel and captures no CUDA graph after ready (bf16 and FP8, from an empty kernel cache);
# (2) `railyard bench throughput --runs 3 --warmup-prompts 0` (the issue-7 workload three times in one engine, each
# run its own prompts) from an empty railyard cache, then again on the cache it left, on the qwen3-0.6b and qwen2-7b
# shapes: the first run against the third (first_over_last, and each run's longest gap between two tokens of a
# request), and the Triton kernels JIT'd after ready; (3) `railyard bench startup` of the
# qwen2-7b shape, cold then warm; (4) the longest gap between two tokens of a stream at 64 streams served, with
# and without --max-prefill-tokens-with-decodes. Each phase starts only if the call has time left for it.
# (5) `profile` (after `startup`, whose checkpoint and warm kernel cache it uses): a warm start of the qwen2-7b
# checkpoint in one process under cProfile (scripts/bench/profile_startup.py), as the defaults and as each of
# $PROFILE_VARIANTS (engine options as --name=value, space-separated).
# Writes $OUT/log.txt, tests.txt, tp_<shape>_<empty|warm>.json, startup.json, gaps_<cap>.json, profile_<variant>.txt/.prof.
#   carry: the wheels in $WHEELS (default .whl: fastapi, starlette, uvicorn, pydantic(-core), pyzmq, msgspec,
#          xgrammar, apache-tvm-ffi, opentelemetry-api, ...)
#   env: CALL_S (seconds this call may use, default 480), PHASES (default "tests throughput startup gaps"; "profile"
#        on request),
#        SHAPES (default "qwen3-0.6b qwen2-7b"), WORK (the throughput workload), CAP (default 2048), COMMIT,
#        BASELINE (a directory holding another checkout's railyard/: phase startup runs the same starts from it too,
#        as $OUT/startup_baseline.json)
. "$(dirname "$0")/common.sh"
. scripts/device/wheels.sh
carried_wheels ${WHEELS:-.whl} > $OUT/pip.txt 2>&1 || { tail -3 $OUT/pip.txt; log "wheel install failed"; exit 1; }
rm -f $OUT/pip.txt
CALL_S=${CALL_S:-480}; PHASES=${PHASES:-"tests throughput startup gaps"}; SHAPES=${SHAPES:-"qwen3-0.6b qwen2-7b"}
WORK=${WORK:-"--num-prompts 256 --input-len 100-1024 --output-len 256 --max-num-batched-tokens 16384"}
CAP=${CAP:-2048}
left() { echo $((CALL_S - SECONDS)); }
want() { [[ " $PHASES " == *" $1 "* ]] && [ "$(left)" -ge "$2" ] || { log "skip $1 ($(left) s left)"; return 1; }; }
log "commit $COMMIT; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"

if want tests 60; then
  log "GPU tests"
  timeout $(( $(left) - 30 )) python3 -m pytest -q -x -p no:cacheprovider -o addopts="" \
    tests/engine/test_ready_at_full_speed.py tests/engine/startup/test_jit_watch.py > $OUT/tests.txt 2>&1
  log "tests rc=$? $(tail -1 $OUT/tests.txt)"
fi

if want throughput 90; then
  for shape in $SHAPES; do
    cache=$(mktemp -d)  # empty for the first engine, then warm (what that one compiled) for the second
    for state in empty warm; do
      [ "$(left)" -ge 60 ] || { log "skip throughput $shape ($state cache)"; continue; }
      log "throughput $shape, $state railyard cache, 3 runs"
      out=$OUT/tp_$(basename $shape)_$state.json
      RAILYARD_CACHE=$cache timeout $(( $(left) - 20 )) python3 -m railyard.cli bench throughput --model $shape \
        $WORK --runs 3 --warmup-prompts 0 > $out 2> /tmp/tp.err
      log "rc=$? $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('runs s', [r['elapsed_s'] \
for r in d['runs']], 'tok/s', [round(r['output_tokens_per_s']) for r in d['runs']], 'first/last', \
d['first_over_last'], 'longest token gap ms', d['longest_token_gap_ms'], 'jit after ready', d['jit_after_ready'], \
'start', d['startup']['total_s'], d['startup']['phases_s'].get('warm_up'))" $out 2>&1 | tail -1)"
    done
  done
fi

CACHE=/tmp/railyard-cache
startup_runs() {  # the runs of a `bench startup` JSON: wall s and the phases over 0.1 s
  python3 -c "import json,sys; d=json.load(open(sys.argv[1]))
for r in d['runs']:
    print(r['cache'], r['wall_s'], {p: s for p, s in r['phases_s'].items() if s >= 0.1}, 'jit', r['triton_jit_s'])" \
    "$1" 2>&1 | tail -4
}
if want startup 100; then
  log "bench startup qwen2-7b: cold, then warm"
  timeout $(( $(left) - 10 )) python3 -m railyard.cli bench startup --checkpoint-dir /tmp/qwen2-7b --model qwen2-7b \
    --runs 3 --cache-dir $CACHE --output $OUT/startup.json > /dev/null 2> /tmp/startup.err
  rc=$?; log "rc=$rc $(startup_runs $OUT/startup.json)"
  [ $rc -eq 0 ] || log "$(tail -n 8 /tmp/startup.err)"  # why, where the call keeps nothing else
fi
if [ -n "${BASELINE:-}" ] && want startup 80; then  # the same starts from another checkout (the code before a change)
  log "bench startup qwen2-7b from $BASELINE: cold, then warm"
  (cd $BASELINE && PYTHONPATH=/tmp/site:$PWD timeout $(( $(left) - 10 )) python3 -m railyard.cli bench startup \
    --checkpoint-dir /tmp/qwen2-7b --runs 3 --output $OUT/startup_baseline.json > /dev/null 2> /tmp/startup_base.err)
  rc=$?; log "rc=$rc $(startup_runs $OUT/startup_baseline.json)"
  [ $rc -eq 0 ] || log "$(tail -n 8 /tmp/startup_base.err)"
fi

if want profile 60; then  # after startup: the kernel cache is warm
  for variant in default ${PROFILE_VARIANTS:-}; do
    [ "$(left)" -ge 45 ] || { log "skip profile $variant"; continue; }
    flags=(); [ "$variant" = default ] || flags=(${variant//=/ })
    log "profile of a warm start, qwen2-7b, $variant"
    RAILYARD_CACHE=$CACHE timeout $(( $(left) - 10 )) python3 scripts/bench/profile_startup.py --model /tmp/qwen2-7b \
      --out $OUT/profile_${variant//[^a-z0-9_]/_} "${flags[@]}" > /tmp/profile.out 2>&1
    log "rc=$? $(tail -1 /tmp/profile.out)"
  done
fi

URL=http://127.0.0.1:8011
gaps() {  # name, serve flags...: one server, 16 warm-up requests, then 384 at 64 streams
  local name=$1; shift
  RAILYARD_CACHE=$CACHE python3 -m railyard.cli serve --model qwen2-7b --port 8011 --max-model-len 4096 "$@" \
    --log-level info > /tmp/server_$name.log 2>&1 &
  SERVER=$!
  for i in $(seq 1 120); do curl -sf $URL/health > /dev/null && break; sleep 1; done
  python3 -m railyard.cli bench serve --url $URL --model qwen2-7b --num-prompts 16 --input-len 100-1024 \
    --output-len 8 --seed 7 > /dev/null 2>&1
  timeout 90 python3 -m railyard.cli bench serve --url $URL --model qwen2-7b --num-prompts 384 --input-len 100-1024 \
    --output-len 256 --max-concurrency 64 --seed 11 > $OUT/gaps_$name.json 2> /tmp/gaps_$name.err
  log "gaps $name rc=$? $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('ITL', d['itl_ms'], \
'TTFT', d['ttft_ms'], 'tok/s', d['output_token_throughput'])" $OUT/gaps_$name.json 2>&1 | tail -1)"
  stop_server
}
if want gaps 70; then gaps default; fi
if want gaps 70; then gaps cap$CAP --max-prefill-tokens-with-decodes $CAP; fi
log "done in ${SECONDS}s"
