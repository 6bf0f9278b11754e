"""Greedy tokens with tensor_parallel_size 1 vs N on one multi-GPU host, as JSON.

A tiny random-weight float32 checkpoint (attention heads >= N, so any N up to 8 splits) runs the same
prompts twice: once in one process, once over N GPUs (NCCL). Prints one JSON object with both token
lists, whether they match, each engine's KV block count and rough timings; exits 1 on a mismatch.

    python scripts/bench/tp_check.py --tp 2                 # needs 2 visible GPUs
    python scripts/bench/tp_check.py --tp 2 --device cpu    # the same check over gloo (no GPU needed)

The timings include process start-up and are no benchmark; they only show the run was sane.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

from railyard.engine.config import SamplingParams
from railyard.engine.llm import LLM
from railyard.engine.startup.tiny_model import write_tiny_checkpoint


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", type=int, default=max(2, torch.cuda.device_count()), help="tensor_parallel_size N")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--arch", default="qwen2", choices=["qwen2", "qwen3", "llama"])
    p.add_argument("--kv-heads", type=int, default=2, help="KV heads (fewer than N exercises KV replication)")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "triton"])
    p.add_argument("--gpu-memory-utilization", type=float, default=0.3,
                   help="for the TP=N run, whose KV pool is profiled on every rank (minimum used)")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    return p.parse_args()


def run(model: str, tp: int, prompts: list[list[int]], args: argparse.Namespace, **extra) -> dict:
    t0 = time.perf_counter()
    llm = LLM(model, tensor_parallel_size=tp, device=args.device, dtype="float32",
              attention_backend=args.attention_backend, enforce_eager=args.enforce_eager, block_size=16,
              max_model_len=512, **extra)
    t1 = time.perf_counter()
    try:
        params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
        outs = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
        t2 = time.perf_counter()
        tokens = [o.outputs[0].token_ids for o in outs]
        return {"tokens": tokens, "num_gpu_blocks": llm.engine.stats().num_total_blocks,
                "start_s": round(t1 - t0, 2), "generate_s": round(t2 - t1, 2),
                "output_tokens_per_s": round(sum(map(len, tokens)) / (t2 - t1), 1)}
    finally:
        llm.engine.shutdown()
        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def main() -> int:
    args = parse_args()
    heads = max(4, args.tp)
    rng = random.Random(0)
    prompts = [[rng.randrange(256) for _ in range(rng.randrange(4, 200))] for _ in range(args.num_prompts)]
    with tempfile.TemporaryDirectory(prefix="tp-check-") as tmp:
        model = str(write_tiny_checkpoint(Path(tmp) / args.arch, args.arch, num_attention_heads=heads,
                                          hidden_size=32 * heads, intermediate_size=64 * heads,
                                          num_key_value_heads=args.kv_heads))
        one = run(model, 1, prompts, args, num_gpu_blocks=1024)
        many = run(model, args.tp, prompts, args, gpu_memory_utilization=args.gpu_memory_utilization)
    mismatched = [i for i, (a, b) in enumerate(zip(one["tokens"], many["tokens"])) if a != b]
    report = {
        "check": "tp_greedy_tokens", "tp": args.tp, "device": args.device, "arch": args.arch,
        "num_attention_heads": heads, "num_kv_heads": args.kv_heads, "vocab_size": 259,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "torch": torch.__version__, "match": not mismatched, "mismatched_prompts": mismatched,
        "tp1": {k: v for k, v in one.items() if k != "tokens"},
        f"tp{args.tp}": {k: v for k, v in many.items() if k != "tokens"},
        "first_mismatch": None if not mismatched else {
            "prompt": mismatched[0], "tp1": one["tokens"][mismatched[0]],
            f"tp{args.tp}": many["tokens"][mismatched[0]]},
    }
    print(json.dumps(report, indent=1))
    return 0 if not mismatched else 1


if __name__ == "__main__":  # the TP workers are spawned processes: the guard keeps them from re-running this
    sys.exit(main())
