#!/bin/bash
# Issue 16 item 4, one device call on one H200 (< 9 minutes): railyard's serve layer on Ray Serve with a GPU engine.
#   1. The Ray Serve stack (`railyard cluster up`): two engine replicas of the qwen3-0.6b shape (random weights)
#      sharing the GPU (gpu_fraction 0.5, each BLOCKS KV blocks), railyard's pending_prefix router, the serve
#      layer's streaming defaults (stream items paced to 500/s per engine replica) with two ingress replicas (the
#      stack default is one: INGRESS_REPLICAS sets it here) behind Ray Serve's HAProxy (the stack default; PROXY=ray:
#      Serve's Python proxy); served
#      tok/s through Ray Serve's proxy at 64 and 256 concurrent streams, then a shared-prefix trace.
#   2. One `railyard serve` on the same GPU with the same total KV (2 x BLOCKS blocks): the same 64 / 256 streams
#      (target: the proxy path >= 90% of this) and the same shared-prefix trace.
#   3. (old) The stack with the streaming settings before: one ingress, the fixed 50 ms interval only
#      (stream_items_per_s 0): 64 / 256 streams, for comparison.
#   4. (opt) The stack of 1 under Ray Serve's throughput mode (RAY_SERVE_THROUGHPUT_OPTIMIZED=1: gRPC between
#      proxy, ingress and replicas instead of Ray actor streaming, user code on the replica's own loop; the proxy
#      kept, RAY_SERVE_ENABLE_DIRECT_INGRESS=0): 64 / 256 streams.
#   5. The stack again with Ray's power_of_two router, then round_robin: the shared-prefix trace each (fleet
#      prefix-cache hit rate from /metrics, TTFT p50/p99, and from Serve's access logs which replica served each
#      request: prefix groups split over both replicas, ingress -> replica per round; scripts/bench/prefix_placement.py).
#      With two ingress replicas each has its own router: pp's trace, right after the 256-stream run, is where
#      each router's stale count of the other's requests kept it on one replica (62% vs 74% with one ingress).
#   6. `railyard bench burst` on the stack autoscaled 1..2 half-GPU replicas (railyard's pending policy) without a
#      standby engine (standby_engines 0), one ingress replica (the stack default; INGRESS_REPLICAS sets it here too).
#   (burst_standby, not in the default phases) The same burst with the stack's autoscaling defaults, which keep a
#      standby engine for half-GPU replicas: the second replica wakes a sleeping engine instead of starting one
#      (PHASES="burst burst_standby" compares the two).
#   (ing1, not in the default phases) The stack of 1 with one ingress replica (the stack default): what the second
#      one adds.
#   (one, not in the default phases) One engine replica with the whole GPU and 2 x BLOCKS blocks behind Ray: the Ray
#      path's cost without two engines time-sharing the GPU.
#   (pair, not in the default phases) Two `railyard serve` processes of BLOCKS blocks each sharing the GPU, no Ray:
#      half the streams to each (two clients at once); what two engines time-slicing one GPU cost without Ray.
# Each step runs under `timeout`, and none starts once the call's budget (CALL_S) is spent, so a failure or hang
# costs its own step only. Results: $OUT/summary.json (every figure), $OUT/log.txt, $OUT/results.tgz (each
# bench JSON, server and cluster logs, /metrics scrapes), $OUT/burst.png, $OUT/ray_logs.tgz (Ray's logs).
#
#   carry: .whl (fastapi, uvicorn, pydantic, pyzmq, msgspec, ...) and .whl-ray (scripts/device/repack_ray_wheel.py)
#   command: COMMIT=<short hash> bash scripts/bench/ray-serve-gpu.sh   (run's timeout_s 600)
#   CPU dry run (the embedded tiny model, small numbers, Ray in its own temp dir and ports):
#     SMALL=1 OUT=/tmp/ray-serve-dry bash scripts/bench/ray-serve-gpu.sh
#   env: CALL_S (default 540), BLOCKS (KV blocks per replica, default 16384 = 28 GiB), MODEL, PORT, DIRECT_PORT,
#        PHASES (default "pp direct old opt p2 rr burst": a second call can run what the first had no time for),
#        STREAM_INTERVAL_S, STREAM_ITEMS_PER_S, INGRESS_REPLICAS (the stack of 1's stream_interval_s,
#        stream_items_per_s and ingress.num_replicas; unset: the serve layer's 0.05 s and 500, and 2 ingress replicas),
#        OUT_LEN (the throughput runs' output tokens, default 256; a range spreads them),
#        ROUNDS (phase alt: interleaved rounds of the direct server without MPS and the Ray stack, both up;
#        default 2), ALT_OUT_LENS (phase alt: the output lengths of each round, e.g. "256 128-384"; default
#        OUT_LEN), ALT_LEVELS (phase alt: "low high" by default, the 64- and 256-stream runs),
#        RENICE (phase pp: its benches again with the engine cores' threads at this nice value, as ppnice),
#        PYSPY_S (seconds of py-spy samples of each engine core process in every throughput run; CPU% per process
#        is recorded in every one: proc_cpu.py),
#        PROXY (the stacks' ingress.proxy: haproxy, the stack default, or ray, Serve's Python proxy; old and opt keep
#        the Python proxy, as they ran before),
#        MPS (1: the whole call under a CUDA MPS daemon of its own, below; phase solo: the direct server first,
#        before the daemon starts), N_LOW / N_HIGH (requests of the 64- and 256-stream runs, default 384 / 768: runs
#        of 6-9 s, where one server's tok/s spread ~13% between runs on the 2026-12-04 H200 calls)
set -o pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ray-serve-gpu}
mkdir -p "$OUT"
R=/tmp/ray-serve-results; rm -rf $R; mkdir -p $R
LOG=$OUT/log.txt; : > "$LOG"
CALL_S=${CALL_S:-540}
PHASES=" ${PHASES:-pp direct old opt p2 rr burst} "
phase() { [[ $PHASES == *" $1 "* ]]; }
PORT=${PORT:-8031} DIRECT_PORT=${DIRECT_PORT:-8032} PAIR_PORT_A=${PAIR_PORT_A:-8033} PAIR_PORT_B=${PAIR_PORT_B:-8034}
log() { echo "== $* (t=${SECONDS}s)" | tee -a "$LOG"; }
left() { echo $(( CALL_S - SECONDS )); }

if [ -n "$SMALL" ]; then  # CPU dry run: every step, tiny sizes
  MODEL=${MODEL:-$(python3 -c "from railyard.engine.startup.tiny_model import ensure_tiny_model; print(ensure_tiny_model())")}
  BLOCKS=${BLOCKS:-256} CPU_FLAG=--cpu DIRECT_FLAGS="--device cpu --dtype float32 --torch-threads 1"
  THREADS=", torch_threads: 1"  # one torch thread per engine: the replicas share few cores
  export RAY_TMPDIR=${RAY_TMPDIR:-/tmp/ray-serve-dry-ray}
  mkdir -p "$RAY_TMPDIR"
  MAXLEN=1024 SEQS=32 TOKENS=2048
  TPUT="--input-len 16-64 --output-len 8"; C_LOW=4 C_HIGH=16 N_LOW=16 N_HIGH=16
  PREFIX_N=24 PREFIX_GROUPS=4
  PREFIX="--num-prompts $PREFIX_N --prefix-groups $PREFIX_GROUPS --shared-prefix-len 128 --input-len 16-64 --output-len 4 --request-rate 4"
  BURST="--rate 1 --burst-factor 24 --steady-s 4 --burst-s 20 --after-s 4 --input-len 16-64 --output-len 128"
  WARM_STREAMS=4  # on 2 cores 16 warm-up streams last long enough to scale the autoscaled stacks up before the burst
  T_UP=240 T_BENCH=120
else
  # The wheels carried in .whl and .whl-ray (Ray 2.60 for Python 3.12 and what ray[serve] needs beyond the image).
  . scripts/device/wheels.sh
  carried_wheels .whl .whl-ray > $R/pip.log 2>&1 || { log "wheel install failed"; tail -5 $R/pip.log | tee -a "$LOG"; }
  # A wheel missing from the carried set shows as an ImportError in every stack's start: say it once, up front.
  python3 -c "from ray import serve; import railyard.serve.app" > $R/imports.log 2>&1 \
    || { log "Ray Serve does not import: $(tail -n 1 $R/imports.log)"; exit 1; }
  # No usage-stats reports (no network there); no OOM killer reading a VM's MemTotal, which starts small and grows.
  export RAY_USAGE_STATS_ENABLED=0 RAY_memory_monitor_refresh_ms=0
  MODEL=${MODEL:-qwen3-0.6b} BLOCKS=${BLOCKS:-16384} CPU_FLAG= DIRECT_FLAGS= WARM_STREAMS=16
  MAXLEN=8192 SEQS=256 TOKENS=8192
  # The issue-12 workload: 100-1024 prompt tokens, 256 out (EOS ignored); 6 and 3 rounds of the streams.
  # OUT_LEN (e.g. 128-384, the same mean): output lengths spread, so that a closed loop's requests do not finish,
  # and come back, in cohorts (with every request 256 tokens long, those admitted in one step finish in one step).
  TPUT="--input-len 100-1024 --output-len ${OUT_LEN:-256}"; C_LOW=64 C_HIGH=256 N_LOW=${N_LOW:-384} N_HIGH=${N_HIGH:-768}
  # 64 documents of 2048 tokens shared by the requests (Poisson 24 req/s): 131k prefix tokens, half of one
  # replica's KV pool, so a router that scatters a prefix over both replicas pays its prefill twice.
  PREFIX_N=384 PREFIX_GROUPS=64
  PREFIX="--num-prompts $PREFIX_N --prefix-groups $PREFIX_GROUPS --shared-prefix-len 2048 --input-len 32-512 --output-len 64 --request-rate 24"
  # A second replica's start (engine, CUDA graphs) must fit in the burst for the fleet to answer it.
  BURST="--rate 4 --burst-factor 8 --steady-s 10 --burst-s 45 --after-s 10 --input-len 100-1024 --output-len 256"
  T_UP=150 T_BENCH=100
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}
# MPS=1: every process of this call (the servers, Ray's replicas) a client of one CUDA MPS control daemon of its own
# (private pipe and log directories, started here before any CUDA context and stopped by `finish`), so two engines
# on the GPU run their kernels at the same time instead of taking turns in time slices; the NVIDIA device plugin's
# MPS sharing gives pods the same on a Kubernetes node. The GPU's compute mode is left as it is.
# The (solo) phase runs before the daemon starts: the direct server without MPS, its best setting.
MPS_DAEMON=
mps_start() {
  [ -z "$MPS" ] && return 0
  export CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d /tmp/railyard-mps-pipe.XXXX) CUDA_MPS_LOG_DIRECTORY=$(mktemp -d /tmp/railyard-mps-log.XXXX)
  if nvidia-cuda-mps-control -d; then
    MPS_DAEMON=1; echo "MPS control daemon started (pipe $CUDA_MPS_PIPE_DIRECTORY)" | tee -a "$LOG"
  else
    echo "MPS=1 but nvidia-cuda-mps-control -d failed ($(command -v nvidia-cuda-mps-control || echo not installed)); stopping" | tee -a "$LOG"
    exit 1
  fi
}
ENGINE="{max_model_len: $MAXLEN, max_num_seqs: $SEQS, max_num_batched_tokens: $TOKENS, num_gpu_blocks: $BLOCKS${THREADS:-}}"
URL=http://127.0.0.1:$PORT DIRECT_URL=http://127.0.0.1:$DIRECT_PORT
SERVER=
UP_ENV=

git log --oneline -1 2>/dev/null | tee -a "$LOG"; echo "commit ${COMMIT:-unknown}" | tee -a "$LOG"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null | tee -a "$LOG"
lscpu 2>/dev/null | grep -E "^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA node\(s\))" | tee -a "$LOG"
python3 -c "import ray, torch; print('ray', ray.__version__, ray.__file__, 'torch', torch.__version__)" 2>&1 | tee -a "$LOG"
# The image's versions of what Ray leans on and .whl-ray does not carry (for the record, if Ray fails to start).
python3 -m pip show aiohttp yarl multidict grpcio 2>/dev/null | grep ^Version | tr '\n' ' ' | tee -a "$LOG"; echo | tee -a "$LOG"
python3 -c "from railyard.engine.startup.tiny_model import ensure_tiny_model; ensure_tiny_model()"  # the shapes' tokenizer

stop() {  # SIGTERM first (cluster up removes its apps and its local Ray; serve stops its engine), then hard; not
  # SIGINT, which a background job of a script ignores. On the device, where no other Ray runs, at most 10 s,
  # then `ray stop --force`.
  [ -z "${SERVER// }" ] && return
  local pid n=60; [ -z "$SMALL" ] && n=20
  for pid in $SERVER; do kill -TERM $pid 2>/dev/null; done
  for pid in $SERVER; do
    for _ in $(seq 1 $n); do kill -0 $pid 2>/dev/null || break; sleep 0.5; done
    kill -KILL $pid 2>/dev/null; wait $pid 2>/dev/null
  done
  SERVER=
  [ -z "$SMALL" ] && { ray stop --force > /dev/null 2>&1; sleep 2; }
}
finish() {
  stop
  python3 - "$R" "$OUT/summary.json" "$BLOCKS" "$MODEL" <<'PY' | tee -a "$LOG"
import json, pathlib, sys
R, out = pathlib.Path(sys.argv[1]), sys.argv[2]
def load(name):
    try:
        return json.loads((R / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None
def bench(d):
    if not d or "output_token_throughput" not in d:
        return None
    return {"completed": d["completed"], "failed": d["failed"], "duration_s": d["duration_s"],
            "output_tok_s": round(d["output_token_throughput"], 1),
            "ttft_p50_ms": d["ttft_ms"]["p50"], "ttft_p99_ms": d["ttft_ms"]["p99"],
            "tpot_p50_ms": d["tpot_ms"]["p50"], "itl_p99_ms": d["itl_ms"]["p99"],
            "server_steps": d.get("server_steps")}  # steps, rows and prefill per step, share of prefill steps
def hit_rate(name):
    before, after = load(f"metrics_{name}_before"), load(f"metrics_{name}_after")
    if not after:
        return None
    before = before or {}
    q = after.get("vllm:prefix_cache_queries_total", 0) - before.get("vllm:prefix_cache_queries_total", 0)
    h = after.get("vllm:prefix_cache_hits_total", 0) - before.get("vllm:prefix_cache_hits_total", 0)
    return {"queried_tokens": q, "hit_tokens": h, "hit_rate": round(h / q, 4) if q else None,
            "routing": {k: after[k] - before.get(k, 0) for k in after if k.startswith("railyard_serve_routing")}}
summary = {"model": sys.argv[4], "kv_blocks_per_replica": int(sys.argv[3]), "throughput": {}, "routing": {}}
# pp: the serve layer's defaults; old: one ingress, fixed 50 ms interval; opt: pp under Ray's throughput mode;
# ing1: pp with one ingress; one: one whole-GPU engine replica
VARIANTS = ("pp", "ppnice", "old", "opt", "ing1", "one")  # ppnice: pp with its engine cores reniced (RENICE)
for c in ("low", "high"):
    direct = bench(load(f"direct_c{c}"))
    row = {"direct": direct}
    solo = bench(load(f"solo_c{c}"))  # MPS=1 only: the direct server without MPS
    if solo:
        row["solo"] = solo
    for v in VARIANTS:
        ray = bench(load(f"ray_{v}_c{c}"))
        row[f"ray_{v}"] = ray
        if ray and direct and direct["output_tok_s"]:
            row[f"ray_{v}_over_direct"] = round(ray["output_tok_s"] / direct["output_tok_s"], 3)
        if ray and solo and solo["output_tok_s"]:
            row[f"ray_{v}_over_solo"] = round(ray["output_tok_s"] / solo["output_tok_s"], 3)
    a, b = load(f"pair_c{c}_a"), load(f"pair_c{c}_b")
    if bench(a) and bench(b):  # two servers at once: their tokens over the longer run
        tokens = sum(d["output_token_throughput"] * d["duration_s"] for d in (a, b))
        pair = {"output_tok_s": round(tokens / max(a["duration_s"], b["duration_s"]), 1),
                "failed": a["failed"] + b["failed"], "tpot_p50_ms": [a["tpot_ms"]["p50"], b["tpot_ms"]["p50"]]}
        row["pair"] = pair
        if direct and direct["output_tok_s"]:
            row["pair_over_direct"] = round(pair["output_tok_s"] / direct["output_tok_s"], 3)
        if solo and solo["output_tok_s"]:
            row["pair_over_solo"] = round(pair["output_tok_s"] / solo["output_tok_s"], 3)
    summary["throughput"][c] = row
for name in ("ray_pp", "ray_p2", "ray_rr", "direct"):
    summary["routing"][name] = {"bench": bench(load(f"{name}_prefix")), "prefix_cache": hit_rate(name),
                                "placement": load(f"placement_{name}")}
burst = load("burst")
for name in ("burst", "burst_standby"):  # standby engines off, then on (autoscaling.standby_engines 1)
    run = load(name)
    if run:
        summary[name] = {k: run.get(k) for k in ("trace", "requests", "failed", "error_counts", "phases", "fleet")}
summary["steps"] = (R / "steps.txt").read_text().splitlines() if (R / "steps.txt").exists() else []
pathlib.Path(out).write_text(json.dumps(summary, indent=1))
for c, row in summary["throughput"].items():
    d = row["direct"]
    print(f"{c:5s} direct {d and d['output_tok_s']} tok/s (TPOT p50 {d and d['tpot_p50_ms']} ms)")
    if row.get("solo"):
        print(f"      solo     {row['solo']['output_tok_s']} tok/s (TPOT p50 {row['solo']['tpot_p50_ms']} ms; the direct "
              f"server without MPS: pair {row.get('pair_over_solo')}, ray pp {row.get('ray_pp_over_solo')}, "
              f"ray one {row.get('ray_one_over_solo')} of it)")
    if row.get("pair"):
        print(f"      pair     {row['pair']['output_tok_s']} tok/s  ratio {row.get('pair_over_direct')}  "
              f"TPOT p50 {row['pair']['tpot_p50_ms']} ms (two servers sharing the GPU, no Ray)")
    for v in VARIANTS:
        r = row[f"ray_{v}"]
        if r:
            print(f"      ray {v:4s} {r['output_tok_s']} tok/s  ratio {row.get(f'ray_{v}_over_direct')} "
                  f"(of solo {row.get(f'ray_{v}_over_solo')})  "
                  f"TTFT p50 {r['ttft_p50_ms']} ms  TPOT p50 {r['tpot_p50_ms']} ms  ITL p99 {r['itl_p99_ms']} ms")
alt = {}
tags = sorted({p.stem.rsplit("_r", 1)[0][len("alt_solo_c"):] for p in R.glob("alt_solo_c*_r*.json")})
for c in tags:  # low / high, then _o<output lengths> where they were not 256
    rounds = []
    for r in range(1, 10):
        solo, ray = bench(load(f"alt_solo_c{c}_r{r}")), bench(load(f"alt_ray_c{c}_r{r}"))
        if solo and ray:
            rounds.append({"solo": solo["output_tok_s"], "ray_pp": ray["output_tok_s"],
                           "ratio": round(ray["output_tok_s"] / solo["output_tok_s"], 3),
                           "prefill_step_fraction": [(x["server_steps"] or {}).get("prefill_step_fraction")
                                                     for x in (solo, ray)]})
    if rounds:
        alt[c] = {"rounds": rounds, "sum_ratio": round(sum(x["ray_pp"] for x in rounds) / sum(x["solo"] for x in rounds), 3)}
        print(f"alt {c}: " + "; ".join(f"solo {x['solo']} ray {x['ray_pp']} ({x['ratio']}; prefill steps "
                                       f"{x['prefill_step_fraction'][0]} / {x['prefill_step_fraction'][1]})" for x in rounds)
              + f"; all rounds {alt[c]['sum_ratio']}")
summary["alt"] = alt
pathlib.Path(sys.argv[2]).write_text(json.dumps(summary, indent=1))
for name, row in summary["routing"].items():
    b, p = row["bench"], row["prefix_cache"]
    pl = row["placement"]
    print(f"{name:7s} hit rate {p and p['hit_rate']}  TTFT p50/p99 {b and b['ttft_p50_ms']}/{b and b['ttft_p99_ms']} "
          f"failed {b and b['failed']}  groups split {pl and pl['groups_split']}")
for name in ("burst", "burst_standby"):
    if name in summary:
        print(name, json.dumps(summary[name]["fleet"]), "failed", summary[name].get("failed"))
PY
  cp $R/burst.png "$OUT/burst.png" 2>/dev/null
  cp $R/burst_standby.png "$OUT/burst_standby.png" 2>/dev/null
  python3 - $R <<'PY' | tee -a "$LOG"  # CPU% per process over each observed run (proc_cpu.py), busiest first
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("cpu_*_c*.json")):
    d = json.loads(f.read_text())
    print(f"cpu {f.stem[4:]}: {d['interval_s']} s, {d['total_cpu_pct']}% of {d['cpus']} CPUs' {d['cpus'] * 100}%, "
          f"load {' '.join(d['loadavg_after'])}")
    for r in d["busiest"][:9]:
        print(f"    {r['cpu_pct']:6.1f}%  {r['pid']:>7} <- {r['ppid']:<7} {r['cmd'][:90]}")
PY
  for f in $R/pyspy_*.txt; do
    [ -s "$f" ] && { echo "py-spy $(basename $f)"; python3 scripts/dev/pyspy_phases.py $f --top 14 | head -40; } | tee -a "$LOG"
  done
  tar czf "$OUT/results.tgz" -C "$(dirname $R)" "$(basename $R)"
  # Ray's own logs of every stack (Serve controller, proxy, replicas; the daemons' stderr), files under 4 MB.
  local ray_tmp=${RAY_TMPDIR:-/tmp}/ray
  (cd $ray_tmp 2>/dev/null && find session_2*/logs \( -path '*/logs/serve/*' -o -name '*.err' \) -size -4M -type f \
    | tar czf "$OUT/ray_logs.tgz" -T - 2>/dev/null)
}
mps_stop() {  # the MPS daemon this call started (it ends its server when asked to quit)
  [ -n "$MPS_DAEMON" ] && { echo quit | nvidia-cuda-mps-control; MPS_DAEMON=; tail -3 $CUDA_MPS_LOG_DIRECTORY/control.log 2>/dev/null \
    | tee -a "$LOG"; }
}
trap 'finish; mps_stop' EXIT

# step NAME MAX_S CMD...: CMD (a program or an exported function) under timeout min(MAX_S, what is left);
# skipped when under 20 s (a server start: 60 s) are left. A server start (up, direct) runs in this shell, which must hold its PID:
# it bounds its own wait by MAX_S instead.
step() {
  local name=$1 max=$2; shift 2
  local l need=20; l=$(left)
  case $1 in up|direct|pair_up) need=60 ;; esac  # a server start with no time left to measure anything is skipped
  if (( l < need )); then log "$name SKIPPED (budget spent)"; echo "$name skipped" >> $R/steps.txt; return 1; fi
  local t=$(( max < l ? max : l ))
  log "$name (timeout ${t}s)"
  local s=$SECONDS rc
  case $1 in
    up|direct|pair_up) WAIT_S=$t "$@" ;;
    *) timeout "$t" bash -c '"$@"' _ "$@" ;;
  esac
  rc=$?
  log "   $name rc=$rc in $(( SECONDS - s ))s"
  echo "$name rc=$rc $(( SECONDS - s ))s" >> $R/steps.txt
  return $rc
}

# Without MPS=1 the replicas time-slice, as in the runs before it (`cluster up` would start a daemon of its own for
# the stack default gpu_sharing mps); with it they use this call's daemon (`cluster up` finds its pipe directory).
SHARING=time-slicing; [ -n "$MPS" ] && SHARING=mps
stack() {  # name kind(yes: autoscaling | no | old | ing1 | one) -> a stack file. old: the streaming settings before
  # the items budget and the second ingress; ing1: one ingress; one: one engine replica with the whole GPU and both
  # replicas' KV.
  local scaling="num_replicas: 2" fraction=0.5 engine=$ENGINE
  local interval=${STREAM_INTERVAL_S:-} budget=${STREAM_ITEMS_PER_S:-} ingress=${INGRESS_REPLICAS:-2}  # 2: the candidate (the stack default is 1)
  local proxy=${PROXY:-haproxy}
  [ "$1" = opt ] && proxy=ray  # Ray's throughput mode with its Python proxy kept, as measured before HAProxy
  [ "$2" = yes ] && scaling="autoscaling: {min_replicas: 1, max_replicas: 2, target_pending_per_replica: 8,
                  upscale_delay_s: 3, downscale_delay_s: 60, look_back_period_s: 5, metrics_interval_s: 1,
                  standby_engines: 0}"
  # standby: the stack's autoscaling defaults, which keep one standby engine for half-GPU replicas
  [ "$2" = standby ] && scaling="autoscaling: {min_replicas: 1, max_replicas: 2}"
  # The bursts keep the stack default of one ingress: the bench reads per-replica TPOT from the one ingress's /metrics
  [ "$2" = yes ] || [ "$2" = standby ] && ingress=${INGRESS_REPLICAS:-1}
  [ "$2" = old ] && { interval=0.05 budget=0 ingress=1 proxy=ray; }
  [ "$2" = ing1 ] && ingress=1
  [ "$2" = one ] && { scaling="num_replicas: 1" fraction=1.0; engine=${ENGINE/num_gpu_blocks: $BLOCKS/num_gpu_blocks: $(( 2 * BLOCKS ))}; }
  cat > $R/stack_$1.yaml <<EOF
name: gpu
image: railyard:local
ingress: {num_replicas: $ingress, proxy: $proxy}
models:
  - name: qwen3
    model: $MODEL
    gpu_fraction: $fraction
    gpu_sharing: $SHARING
    $scaling
    engine: $engine
    ${interval:+stream_interval_s: $interval}
    ${budget:+stream_items_per_s: $budget}
EOF
  echo $R/stack_$1.yaml
}

up() {  # name router stack: `railyard cluster up` in the background (its Ray processes under $UP_ENV, the
  # environment of this stack's Ray: empty, or Ray Serve's throughput mode); returns once it serves (or died)
  env $UP_ENV python3 -m railyard.cli cluster up -c "$3" --router "$2" --port $PORT $CPU_FLAG > $R/cluster_$1.log 2>&1 &
  SERVER=$!
  for _ in $(seq 1 $(( WAIT_S * 2 ))); do
    grep -q "Ctrl-C to stop" $R/cluster_$1.log && break
    kill -0 $SERVER 2>/dev/null || { tail -20 $R/cluster_$1.log; return 1; }
    sleep 0.5
  done
  grep -q "Ctrl-C to stop" $R/cluster_$1.log || return 1
  RAY_GCS=$(grep -o "Ray at [^)]*" $R/cluster_$1.log | cut -d' ' -f3)
  grep "Ray at" $R/cluster_$1.log | tail -1
}

direct() {  # [port blocks name]: one `railyard serve`, by default with both replicas' KV
  local port=${1:-$DIRECT_PORT} blocks=${2:-$(( 2 * BLOCKS ))} name=${3:-direct}
  port=${port:-$DIRECT_PORT} blocks=${blocks:-$(( 2 * BLOCKS ))}
  python3 scripts/bench/cli.py serve --model $MODEL --served-model-name qwen3 --port $port \
    --max-model-len $MAXLEN --max-num-seqs $SEQS --max-num-batched-tokens $TOKENS --num-gpu-blocks $blocks \
    $DIRECT_FLAGS > $R/server_$name.log 2>&1 &
  SERVER="$SERVER $!"
  local pid=$!
  for _ in $(seq 1 $(( WAIT_S * 2 ))); do
    curl -sf http://127.0.0.1:$port/health > /dev/null && return 0
    kill -0 $pid 2>/dev/null || { tail -20 $R/server_$name.log; return 1; }
    sleep 0.5
  done
  return 1
}
pair_up() {  # two `railyard serve` of one replica's KV each on the same GPU, started one after the other (each
  # sizes its own memory; explicit block counts)
  direct $PAIR_PORT_A $BLOCKS pair_a && direct $PAIR_PORT_B $BLOCKS pair_b
}
pair_bench() {  # name streams prompts: half the streams and prompts to each server at once; one JSON per server
  local name=$1 c=$(( $2 / 2 )) n=$(( $3 / 2 ))
  bench ${name}_a http://127.0.0.1:$PAIR_PORT_A $TPUT --num-prompts $n --max-concurrency $c &
  local a=$!
  bench ${name}_b http://127.0.0.1:$PAIR_PORT_B $TPUT --num-prompts $n --max-concurrency $c
  local rc=$?
  wait $a && return $rc
}

bench() {  # name url flags...: one `railyard bench serve`
  local name=$1 url=$2; shift 2
  python3 -m railyard.cli bench serve --url $url --model qwen3 --seed 0 "$@" > $R/$name.json 2> $R/$name.err
}
observed() {  # name cmd...: the command, and every process's CPU% over it ($R/cpu_NAME.json); with PYSPY_S, py-spy's
  # samples of each engine core process for PYSPY_S seconds from 5 s in ($R/pyspy_NAME_PID.txt)
  local name=$1 spies= pid; shift
  python3 scripts/bench/proc_cpu.py snapshot $R/cpu_before.json
  if [ -n "$PYSPY_S" ] && command -v py-spy > /dev/null; then
    for pid in $(python3 scripts/bench/proc_cpu.py engine-cores); do
      (sleep 5; timeout $(( PYSPY_S + 10 )) py-spy record -p $pid -d $PYSPY_S -r 200 --nonblocking --idle --threads --format raw \
        -o $R/pyspy_${name}_$pid.txt > /dev/null 2>&1) &
      spies="$spies $!"
    done
  fi
  "$@"; local rc=$?
  python3 scripts/bench/proc_cpu.py snapshot $R/cpu_after.json
  python3 scripts/bench/proc_cpu.py diff $R/cpu_before.json $R/cpu_after.json > $R/cpu_$name.json
  [ -z "$spies" ] || wait $spies
  return $rc
}
warm() {  # url: Triton JIT and CUDA graphs of both replicas warm, outside the measurements
  python3 -m railyard.cli bench serve --url $1 --model qwen3 --num-prompts 32 --input-len 64-512 --output-len 16 \
    --max-concurrency $WARM_STREAMS --seed 99 > /dev/null 2> $R/warm.err
}
scrape() {  # name url: the fleet's prefix-cache and routing counters from /metrics, as JSON
  curl -s $2/metrics > $R/metrics_$1.txt
  python3 scripts/bench/prefix_metrics.py $R/metrics_$1.txt > $R/metrics_$1.json
}
prefix_trace() {  # name url: the shared-prefix trace, with /metrics before and after
  scrape $1_before $2; bench $1_prefix $2 $PREFIX; local rc=$?; scrape $1_after $2; return $rc
}
placement() {  # name: which replica served each request of the prefix trace, from the newest Ray session's Serve
  # access logs (groups split over replicas = prefixes computed more than once; ingress -> replica per round)
  sleep 2  # the replicas write a request's access line as its stream closes
  local logs; logs=$(ls -td ${RAY_TMPDIR:-/tmp}/ray/session_2*/logs/serve 2>/dev/null | head -1)
  [ -n "$logs" ] && python3 scripts/bench/prefix_placement.py "$logs" --groups $PREFIX_GROUPS --requests $PREFIX_N \
    > $R/placement_$1.json 2>> $R/placement.err
}
burst() {  # [name] the burst trace on the autoscaled stack; RAY_AUTH_MODE=token: it joins the token-authenticated
  # local Ray at an explicit address to read serve.status()
  local name=${1:-burst}
  RAY_AUTH_MODE=token python3 -m railyard.cli bench burst --url $URL --model qwen3 $BURST --seed 0 --app gpu \
    --deployment engine-qwen3-default --ray-address "$RAY_GCS" --plot $R/$name.png > $R/$name.json 2> $R/$name.err
}
export -f bench observed warm scrape prefix_trace burst pair_bench
export TPUT PAIR_PORT_A PAIR_PORT_B
export R PREFIX URL BURST WARM_STREAMS

# (solo, with MPS=1) One railyard serve as in 2, started before the MPS daemon: the direct path at its best (an MPS
# client pays for the daemon's scheduling even alone), so the MPS runs' ratios have both denominators.
if phase solo && [ -n "$MPS" ] && step "direct up (no MPS)" $T_UP direct "" "" solo; then
  step "warm-up" 60 warm $DIRECT_URL
  step "solo c$C_LOW" $T_BENCH observed solo_clow bench solo_clow $DIRECT_URL $TPUT --num-prompts $N_LOW --max-concurrency $C_LOW
  step "solo c$C_HIGH" $T_BENCH observed solo_chigh bench solo_chigh $DIRECT_URL $TPUT --num-prompts $N_HIGH --max-concurrency $C_HIGH
fi
stop
# (alt, with MPS=1) Interleaved rounds in one call: the direct server without MPS (started before the daemon) and
# the Ray stack of 1 (under it) up at once, benched in turn (one at a time has work), ROUNDS (default 2) times:
# the same-call comparison, without the run-to-run drift of a machine between a phase and the next.
ALT_DIRECT=
if phase alt && step "direct up (no MPS, kept up)" $T_UP direct "" "" solo; then
  step "warm-up" 60 warm $DIRECT_URL
  ALT_DIRECT=$SERVER SERVER=
fi
mps_start
FIXED=$(stack fixed no)
if [ -n "$ALT_DIRECT" ] && step "ray up (pending_prefix, beside the direct server)" $T_UP up pp pending_prefix $FIXED; then
  step "warm-up" 60 warm $URL
  for r in $(seq 1 ${ROUNDS:-2}); do
    for o in ${ALT_OUT_LENS:-${OUT_LEN:-256}}; do
      work="--input-len 100-1024 --output-len $o" tag=; [ "$o" != 256 ] && tag=_o${o/-/to}
      for c in ${ALT_LEVELS:-low high}; do
        n=$N_LOW k=$C_LOW; [ $c = high ] && n=$N_HIGH k=$C_HIGH
        [ -n "$SMALL" ] && work="$TPUT"
        step "solo c$k out $o round $r" $T_BENCH observed alt_solo_c${c}${tag}_r$r bench alt_solo_c${c}${tag}_r$r \
          $DIRECT_URL $work --num-prompts $n --max-concurrency $k
        step "ray c$k out $o round $r" $T_BENCH observed alt_ray_c${c}${tag}_r$r bench alt_ray_c${c}${tag}_r$r \
          $URL $work --num-prompts $n --max-concurrency $k
      done
    done
  done
fi
SERVER="$SERVER $ALT_DIRECT"; stop

# 1. The Ray Serve stack, two half-GPU replicas, railyard's router: throughput through the proxy, prefix trace.
if phase pp && step "ray up (pending_prefix)" $T_UP up pp pending_prefix $FIXED; then
  step "warm-up" 60 warm $URL
  step "ray c$C_LOW" $T_BENCH observed ray_pp_clow bench ray_pp_clow $URL $TPUT --num-prompts $N_LOW --max-concurrency $C_LOW
  step "ray c$C_HIGH" $T_BENCH observed ray_pp_chigh bench ray_pp_chigh $URL $TPUT --num-prompts $N_HIGH --max-concurrency $C_HIGH
  if [ -n "$RENICE" ]; then  # the same stack again with every thread of its engine cores at nice $RENICE
    for pid in $(python3 scripts/bench/proc_cpu.py engine-cores); do
      for task in /proc/$pid/task/*; do renice -n $RENICE -p ${task##*/} > /dev/null; done
      log "engine core $pid: nice $(ps -o ni= -p $pid)"
    done
    step "ray nice c$C_LOW" $T_BENCH observed ray_ppnice_clow bench ray_ppnice_clow $URL $TPUT --num-prompts $N_LOW --max-concurrency $C_LOW
    step "ray nice c$C_HIGH" $T_BENCH observed ray_ppnice_chigh bench ray_ppnice_chigh $URL $TPUT --num-prompts $N_HIGH --max-concurrency $C_HIGH
  fi
  step "ray prefix trace (pending_prefix)" $T_BENCH prefix_trace ray_pp $URL && placement ray_pp
fi
stop

# 2. One railyard serve with the same total KV: the same benchmarks.
if phase direct && step "direct up" $T_UP direct; then
  step "warm-up" 60 warm $DIRECT_URL
  step "direct c$C_LOW" $T_BENCH observed direct_clow bench direct_clow $DIRECT_URL $TPUT --num-prompts $N_LOW --max-concurrency $C_LOW
  step "direct c$C_HIGH" $T_BENCH observed direct_chigh bench direct_chigh $DIRECT_URL $TPUT --num-prompts $N_HIGH --max-concurrency $C_HIGH
  step "direct prefix trace" $T_BENCH prefix_trace direct $DIRECT_URL
fi
stop

# (pair) Two `railyard serve` sharing the GPU, no Ray: the same 64 / 256 streams split between them.
if phase pair && step "pair up" $T_UP pair_up; then
  step "warm-up" 60 warm http://127.0.0.1:$PAIR_PORT_A
  step "warm-up" 60 warm http://127.0.0.1:$PAIR_PORT_B
  step "pair c$C_LOW" $T_BENCH observed pair_clow pair_bench pair_clow $C_LOW $N_LOW
  step "pair c$C_HIGH" $T_BENCH observed pair_chigh pair_bench pair_chigh $C_HIGH $N_HIGH
fi
stop

# 3. The streaming settings before (one ingress, the fixed 50 ms interval), then 4. the defaults under Ray Serve's
# throughput mode (gRPC data plane; the proxy kept): the same 64 / 256 streams. (ing1): the defaults with one
# ingress. (one): one whole-GPU replica.
for variant in "old old" "opt no" "ing1 ing1" "one one"; do
  set -- $variant
  UP_ENV=; [ $1 = opt ] && UP_ENV="RAY_SERVE_THROUGHPUT_OPTIMIZED=1 RAY_SERVE_ENABLE_DIRECT_INGRESS=0"
  if phase $1 && step "ray up ($1)" $T_UP up $1 pending_prefix "$(stack $1 $2)"; then
    step "warm-up" 60 warm $URL
    step "ray $1 c$C_LOW" $T_BENCH bench ray_$1_clow $URL $TPUT --num-prompts $N_LOW --max-concurrency $C_LOW
    step "ray $1 c$C_HIGH" $T_BENCH bench ray_$1_chigh $URL $TPUT --num-prompts $N_HIGH --max-concurrency $C_HIGH
  fi
  stop
done
UP_ENV=

# 5. Ray's power-of-two router and round robin on the same trace.
for pair in "p2 power_of_two" "rr round_robin"; do
  set -- $pair
  if phase $1 && step "ray up ($2)" $T_UP up $1 $2 $FIXED; then
    step "warm-up" 60 warm $URL
    step "ray prefix trace ($2)" $T_BENCH prefix_trace ray_$1 $URL && placement ray_$1
  fi
  stop
done

# 6. A burst on the autoscaled stack: 1 replica steady, a second half-GPU replica when the burst's pending work asks.
if phase burst && step "ray up (autoscaling 1..2)" $T_UP up burst pending_prefix "$(stack burst yes)"; then
  step "warm-up" 60 warm $URL
  export RAY_GCS
  step "burst" 200 burst
fi
stop

# 7. The same burst on the autoscaling defaults (one standby engine for half-GPU replicas): the second replica wakes
#    a sleeping engine its node's pool started beside the first, instead of starting one. STANDBY_WAIT_S after the
#    warm-up lets the pool's standby finish its start (a replica start, ~17 s on the H200) before the burst begins.
if phase burst_standby && step "ray up (autoscaling 1..2, one standby engine)" $T_UP up burst_standby pending_prefix \
    "$(stack burst_standby standby)"; then
  step "warm-up" 60 warm $URL
  sleep ${STANDBY_WAIT_S:-30}
  export RAY_GCS
  step "burst (standby)" 200 burst burst_standby
fi
log done
