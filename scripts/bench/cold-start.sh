#!/bin/bash
# Cold start of one engine on the H200, one device call: `railyard bench startup` writes a
# random-weight safetensors checkpoint of the qwen2-7b shape to local disk, reads it once into the page cache
# (deliberately: the runs load from the page cache), then starts `railyard serve` on it RUNS times, the first with
# an empty railyard cache (Triton compiles every kernel), the rest warm, each to its first /health 200, with the
# server's start-up phases from /metrics (weight loading split into read / to_device / copy / other, and the
# front's tokenizer load beside it, in the front's own process: since 0d55b5e the engine process loads no HF
# tokenizer before it is ready, its EOS id read from the files in the tokenizer_eos phase). Then the offline 7B benchmark's decode
# benchmark, unchanged, in the same call.
# Writes $OUT/startup.json, $OUT/throughput.json and $OUT/log.txt (its summary at the end, also on stdout).
#   carry: .whl (fastapi, starlette, uvicorn, pydantic(-core), httptools, pyzmq, msgspec, ...)
#   env: CALL_S (seconds this call may use, default 450), RUNS (default 3), SERVE_ARGS (more serve flags),
#        CKPT (checkpoint dir, default /tmp/qwen2-7b: written, and removed at the end; an existing one is kept),
#        SHAPE (default qwen2-7b), WORK (the decode check's workload: the offline 7B benchmark's by default), SKIP_WHEELS
set -o pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; LOG=$OUT/log.txt
. scripts/device/wheels.sh
carried_wheels .whl > /tmp/pip.log 2>&1 || { tail -3 /tmp/pip.log; echo "wheel install failed" | tee -a $LOG; exit 1; }
# The server's imports first: a package the wheels lack fails here in seconds, not after the checkpoint is written.
python3 -c "import railyard.api.app" > /tmp/imports.log 2>&1 \
  || { tail -1 /tmp/imports.log | tee -a $LOG; echo "the server's imports fail: carry the missing wheels in .whl" | tee -a $LOG; exit 1; }
CALL_S=${CALL_S:-450}; RUNS=${RUNS:-3}; CKPT=${CKPT:-/tmp/qwen2-7b}; SERVE_ARGS=${SERVE_ARGS:-"--log-level info"}
SHAPE=${SHAPE:-qwen2-7b}; WORK=${WORK:-"--num-prompts 256 --input-len 100-1024 --output-len 256 --max-num-batched-tokens 16384"}
[ -f $CKPT/config.json ] && KEEP_CKPT=1
left() { echo $((CALL_S - SECONDS)); }
say() { echo "== $* (t=${SECONDS}s)" | tee -a $LOG; }
finish() {
  python3 - "$OUT" <<'PY' | tee -a $LOG
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
try:
    d = json.loads((out / "startup.json").read_text())
    w = d.get("checkpoint_written") or {}
    print(f"checkpoint {d['checkpoint_bytes'] / 1e9:.2f} GB, written in {w.get('seconds', 0):.1f} s "
          f"({w.get('gb_per_s')} GB/s); written back (sync) {d.get('sync_s')} s; pre-read into the page cache "
          f"{d.get('pre_read')}")
except Exception as exc:
    print("startup.json unreadable:", exc)
for name in ("startup.json",):
    try:
        d = json.loads((out / name).read_text())
    except Exception as exc:
        print(name, "unreadable:", exc)
        continue
    for i, r in enumerate(d["runs"]):
        print(f"{name} run {i} {r['cache']}: wall {r['wall_s']:.2f} s, server {r['total_s']:.2f} s, weights "
              f"{r['weights_gb_per_s']} GB/s ({r.get('weights_reader')}: "
              + ", ".join(f"{p} {s:.2f}" for p, s in (r.get("weight_parts_s") or {}).items())
              + f"; beside it, the front's {r.get('background_s')}), Triton JIT {r['triton_jit_s']:.2f} s for "
              f"{r['triton_kernels']} kernels ({r['triton_compiled']} compiled), page cache {r['page_cache_resident']}")
        print("   ", ", ".join(f"{p} {s:.2f}" for p, s in r["phases_s"].items()))
        for line in r.get("capture_lines", []):
            print("    ", line[-150:])
try:
    t = json.loads((out / "throughput.json").read_text())
    print(f"decode check (the offline 7B benchmark): {t['elapsed_s']:.2f} s, {t['output_tokens_per_s']:.0f} output tok/s, "
          f"{t.get('percent_of_roofline')}% of roofline")
except Exception as exc:
    print("throughput.json unreadable:", exc)
PY
}
trap finish EXIT
git log --oneline -1 2>/dev/null | tee -a $LOG; echo "commit ${COMMIT:-unknown}" | tee -a $LOG
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a $LOG
python3 -c "import torch, triton, zmq, msgspec, fastapi, uvicorn, safetensors; print(torch.__version__, triton.__version__, safetensors.__version__)" 2>&1 | tee -a $LOG
df -h /tmp | tail -1 | tee -a $LOG; free -g | head -2 | tee -a $LOG

say "bench startup: write the checkpoint, then $RUNS starts"
timeout $(( $(left) - 100 )) python3 -m railyard.cli bench startup --model $SHAPE --checkpoint-dir $CKPT \
  --runs $RUNS --page-cache warm --serve-args "$SERVE_ARGS" --timeout 240 --output $OUT/startup.json \
  > /dev/null 2> >(tee -a $LOG >&2)
echo "bench startup rc=$?" | tee -a $LOG

say "decode check: the offline 7B benchmark"
timeout $(( $(left) > 40 ? $(left) - 10 : 30 )) python3 scripts/bench/cli.py bench throughput --model $SHAPE $WORK \
  > $OUT/throughput.json 2> >(grep -E "roofline|start-up|memory profile|captured|Error|error" | tee -a $LOG >&2)
echo "throughput rc=$?" | tee -a $LOG
[ -n "$KEEP_CKPT" ] || rm -rf $CKPT
say done
