#!/bin/bash
# Piecewise CUDA graphs for steps that are not pure decode (ITL at Poisson 8 req/s), one device call on one H200:
#  1. GPU tests: graph replay against the eager forward, greedy output against HF transformers through the
#     captured pieces (tests/engine/runner/test_piecewise_graphs.py, tests/engine/test_hf_equivalence.py);
#  2. `railyard serve` (qwen2-7b shape, random bf16 weights) at Poisson 8 req/s, prompts 100-1024, 256 output
#     tokens, EOS ignored: piecewise graphs ON, OFF (--no-piecewise-cuda-graphs), and ON with
#     --long-prefill-token-threshold for each of THRESHOLDS, and ON with --max-prefill-tokens-with-decodes for each
#     of MIXED_CAPS; ITL / TTFT / TPOT percentiles, output tok/s, and the server's capture time and graph memory
#     from its log;
#  3. `railyard bench throughput` offline (512 prompts 100-1024 -> 256, default budget), ON against OFF.
# Writes $OUT/summary.json, $OUT/summary.txt, $OUT/pytest.txt and $OUT/results.tgz (every JSON and log).
#   carry: .whl (fastapi, starlette, uvicorn, pydantic(-core), httptools, pyzmq, msgspec, ...)
#   env: CALL_S (seconds this call may use, default 470), THRESHOLDS (default "256"), MIXED_CAPS (default
#        "128 192 256"), SKIP_OFF (no run with the pieces off), RATE_PROMPTS (default 200), SKIP_TESTS, SKIP_WHEELS,
#        MODEL/ENGINE/WORK/OFFLINE_PROMPTS (a dry run on a small model)
set -o pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
. scripts/device/wheels.sh
carried_wheels .whl || { echo "wheel install failed"; exit 1; }
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
R=/tmp/results; rm -rf $R; mkdir -p $R; LOG=$R/log.txt
CALL_S=${CALL_S:-470}; THRESHOLDS=${THRESHOLDS:-"256"}; MIXED_CAPS=${MIXED_CAPS-"128 192 256"}
RATE_PROMPTS=${RATE_PROMPTS:-200}
MODEL=${MODEL:-qwen2-7b}; NAME=$(basename $MODEL); PORT=8012; URL=http://127.0.0.1:$PORT
ENGINE=${ENGINE:-"--max-model-len 4096 --max-num-seqs 256"}
WORK=${WORK:-"--input-len 100-1024 --output-len 256"}; OFFLINE_PROMPTS=${OFFLINE_PROMPTS:-512}
left() { echo $((CALL_S - SECONDS)); }
say() { echo "== $* (t=${SECONDS}s)" | tee -a $LOG; }
finish() {
  python3 - "$R" "$OUT" <<'PY'
import json, pathlib, re, sys
res, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
summary, lines = {}, []
pat = re.compile(r"(captured (?:decode|piecewise) CUDA graphs.*|piecewise CUDA graphs hold.*|memory profile.*)$")
for f in sorted(res.glob("*.json")):
    try:
        d = json.loads(f.read_text())
    except Exception as exc:
        summary[f.stem] = {"error": f"unreadable: {exc}"}; continue
    log = res / (f.stem + ".log")
    notes = [m.group(1) for m in map(pat.search, log.read_text(errors="replace").splitlines()) if m] \
        if log.exists() else []
    if "output_token_throughput" in d:
        row = {k: d.get(k) for k in ("completed", "failed", "duration_s", "output_token_throughput")}
        row.update({k: d.get(k) for k in ("itl_ms", "ttft_ms", "tpot_ms", "server_steps")})
        itl = d["itl_ms"]
        row["itl_p99_over_p50"] = round(itl["p99"] / itl["p50"], 2) if itl.get("p50") else None
        lines.append(f"{f.stem:24s} done {d['completed']}/{d['failed']} out {d['output_token_throughput']:8.1f} tok/s "
                     f"ITL p50/p99 {itl['p50']}/{itl['p99']} (x{row['itl_p99_over_p50']}) TTFT p50/p99 "
                     f"{d['ttft_ms']['p50']}/{d['ttft_ms']['p99']} TPOT p50/p99 {d['tpot_ms']['p50']}/{d['tpot_ms']['p99']} "
                     f"steps {d.get('server_steps')}")
    else:
        row = {k: d.get(k) for k in ("elapsed_s", "output_tokens_per_s", "percent_of_roofline", "num_kv_blocks",
                                     "num_preemptions")}
        lines.append(f"{f.stem:24s} {d.get('elapsed_s')} s out {d.get('output_tokens_per_s')} tok/s roofline "
                     f"{d.get('percent_of_roofline')}% blocks {d.get('num_kv_blocks')}")
    row["server_log"] = notes
    lines += [f"    {n}" for n in notes]
    summary[f.stem] = row
tests = res / "pytest.txt"
if tests.exists():
    text = tests.read_text(errors="replace").strip().splitlines()
    summary["pytest"] = text[-1] if text else ""
    lines.insert(0, f"pytest: {summary['pytest']}")
(out / "summary.json").write_text(json.dumps(summary, indent=1))
(out / "summary.txt").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
  cp $R/pytest.txt $OUT/ 2>/dev/null
  tar czf $OUT/results.tgz -C /tmp results
}
trap finish EXIT
git log --oneline -1 2>/dev/null | tee -a $LOG
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv | tee -a $LOG
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" \
  2>&1 | tee -a $LOG

# 1. Correctness through the captured pieces (the HF-equality tests run on CUDA with piecewise graphs on).
if [ -z "$SKIP_TESTS" ]; then
  say "GPU tests"
  timeout 160 python3 -m pytest -q -p no:cacheprovider -rs tests/engine/runner/test_piecewise_graphs.py \
    tests/engine/test_hf_equivalence.py tests/engine/runner/models/test_safetensors_reader.py > $R/pytest.txt 2>&1
  echo "pytest rc=$? $(tail -1 $R/pytest.txt)" | tee -a $LOG
fi

# 2. Served at Poisson 8 req/s.
SERVER=
serve() {  # name, serve flags...
  local name=$1; shift
  say "serve $name ($*)"
  python3 -m railyard.cli serve --model $MODEL --port $PORT $ENGINE --log-level info "$@" > $R/$name.log 2>&1 &
  SERVER=$!
  for i in $(seq 1 150); do curl -sf $URL/health > /dev/null && break; kill -0 $SERVER 2>/dev/null || break; sleep 1; done
  echo "up after ${i}s" | tee -a $LOG
  python3 -m railyard.cli bench serve --url $URL --model $NAME --num-prompts 16 --input-len 100-1024 \
    --output-len 8 --seed 7 > /dev/null 2>&1  # untimed warm-up (Triton JIT of attention)
}
stop() {
  kill -INT $SERVER; for i in $(seq 1 40); do kill -0 $SERVER 2>/dev/null || break; sleep 0.5; done
  kill -9 $SERVER 2>/dev/null; wait $SERVER 2>/dev/null
  sleep 2  # the engine process frees the GPU as it exits
}
poisson() {  # name, serve flags...
  local name=$1; shift
  [ $(left) -lt 100 ] && { say "skip $name: $(left) s left"; return; }
  serve $name "$@"
  timeout 90 python3 -m railyard.cli bench serve --url $URL --model $NAME $WORK --request-rate 8 \
    --num-prompts $RATE_PROMPTS --seed 1 > $R/$name.json 2> $R/$name.err
  echo "$name rc=$?" | tee -a $LOG
  stop
}
poisson poisson8_on
[ -n "$SKIP_OFF" ] || poisson poisson8_off --no-piecewise-cuda-graphs
for M in $MIXED_CAPS; do poisson poisson8_on_m$M --max-prefill-tokens-with-decodes $M; done
for T in $THRESHOLDS; do poisson poisson8_on_t$T --long-prefill-token-threshold $T; done

# 3. Offline, the default budget: ON against OFF (run only as a pair).
if [ $(left) -gt 110 ]; then
  for MODE in on off; do
    FLAG=""; [ $MODE = off ] && FLAG=--no-piecewise-cuda-graphs
    say "offline $MODE"
    timeout 100 python3 scripts/bench/cli.py bench throughput --model $MODEL --num-prompts $OFFLINE_PROMPTS $WORK $ENGINE \
      --token-id-range 256 $FLAG > $R/offline_$MODE.json 2> $R/offline_$MODE.log
    echo "offline_$MODE rc=$?" | tee -a $LOG
  done
else
  say "skip offline: $(left) s left"
fi
say done
