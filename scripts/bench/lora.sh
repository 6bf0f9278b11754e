#!/bin/bash
# LoRA's cost, one device call on the H200: (1) the GPU tests of the batched LoRA kernels and of LoRA under both
# graph paths; (2) `railyard bench throughput --num-loras N` on the qwen2-7b shape at 256 streams, which runs the
# workload on the base model, then spread evenly over N random rank-16 adapters (each on a fresh engine, after its
# start-up warm-up): N = 8 and 1, twice each in alternating order, so the spread shows beside the ratio.
# Writes $OUT/log.txt, tests.txt, lora<N>_<round>.json.
#   carry: the wheels in $WHEELS (default .whl)
#   env: CALL_S (seconds this call may use, default 480), ROUNDS (default 2), PHASES (default "tests bench"), COMMIT
. "$(dirname "$0")/common.sh"
. scripts/device/wheels.sh
carried_wheels ${WHEELS:-.whl} > $OUT/pip.txt 2>&1 || { tail -3 $OUT/pip.txt; log "wheel install failed"; exit 1; }
rm -f $OUT/pip.txt
CALL_S=${CALL_S:-480}; ROUNDS=${ROUNDS:-2}; PHASES=${PHASES:-"tests bench"}
WORK="--num-prompts 256 --input-len 100-1024 --output-len 256 --max-num-batched-tokens 16384 --max-model-len 4096"
left() { echo $((CALL_S - SECONDS)); }
want() { [[ " $PHASES " == *" $1 "* ]] && [ "$(left)" -ge "$2" ] || { log "skip $1 ($(left) s left)"; return 1; }; }
log "commit $COMMIT; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"

if want tests 60; then
  timeout 150 python3 -m pytest -q -x -p no:cacheprovider -o addopts="" \
    tests/engine/runner/kernels/test_lora_kernels.py tests/engine/runner/models/test_mlp_lora.py \
    tests/engine/runner/test_lora_graph_paths.py > $OUT/tests.txt 2>&1
  log "tests rc=$? $(tail -1 $OUT/tests.txt)"
fi

for round in $(seq 1 $ROUNDS); do
  for n in 8 1; do
    want bench 75 || continue
    timeout $(( $(left) - 10 )) python3 -m railyard.cli bench throughput --model qwen2-7b $WORK --max-num-seqs 256 \
      --num-loras $n --lora-rank 16 > $OUT/lora${n}_$round.json 2> /tmp/lora.err
    log "lora$n round $round rc=$? $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); \
f=lambda r: (r['elapsed_s'], round(r['output_tokens_per_s']), r['ttft_ms']['p50'], r['tpot_ms']['p50'], r.get('num_kv_blocks')); \
print('base', f(d['base']), 'lora', f(d['lora']), 'ratio', d['lora_over_base_output_tokens_per_s'])" \
      $OUT/lora${n}_$round.json 2>&1 | tail -1)"
  done
done
log "done in ${SECONDS}s"
