"""The MoE slot list (kernels/moe_align.py) from one block against its three launches, at the token counts a decode
step runs: microseconds per align_by_expert call replayed in CUDA graphs (as the engine runs it, once per MoE layer
and step), the two paths interleaved over rounds so that a drift of the card's clocks falls on both, and whether
they wrote the same list. gpt-oss-20b's routing (32 experts, top-4) and Qwen3-30B-A3B's (128, top-8), each with the
row block the engine's tile table gives that token count.

    python3 scripts/dev/moe_align_ab.py                 # JSON lines on stdout, all of them in $OUT/moe_align_ab.json
    python3 scripts/dev/moe_align_ab.py --tokens 64,256 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])

import torch  # noqa: E402
from triton.testing import do_bench_cudagraph  # noqa: E402

from railyard.engine.runner.kernels import moe_align  # noqa: E402
from railyard.engine.runner.kernels.fused_moe import pick_config  # noqa: E402

SHAPES = {"gpt-oss-20b": (32, 4, True), "qwen3-30b-a3b": (128, 8, False)}  # experts, top-k, MXFP4 tiles
PATHS = {"one_program": 4096, "three_launches": 0}  # each path taken at every token count timed


def _align(ids: torch.Tensor, experts: int, block_m: int, bound: int) -> list[torch.Tensor]:
    """align_by_expert with the one-block path's bound set to `bound` for this call, the module's put back after."""
    engine_bound = moe_align.ONE_PROGRAM_SLOTS
    moe_align.ONE_PROGRAM_SLOTS = bound
    try:
        return list(moe_align.align_by_expert(ids, experts, block_m))
    finally:
        moe_align.ONE_PROGRAM_SLOTS = engine_bound


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="1,64,256,512")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for shape, (experts, top_k, mxfp4) in SHAPES.items():
        for tokens in (int(t) for t in args.tokens.split(",")):
            gen = torch.Generator(device="cuda").manual_seed(tokens)
            ids = torch.rand(tokens, experts, generator=gen, device="cuda").topk(top_k, dim=1).indices
            block_m = pick_config(tokens * top_k, experts, False, mxfp4)[0]
            lists = {path: _align(ids, experts, block_m, bound) for path, bound in PATHS.items()}
            same = all(torch.equal(a, b) for a, b in zip(*lists.values(), strict=True))
            times: dict[str, list[float]] = {path: [] for path in PATHS}
            for r in range(args.rounds):
                for path in (list(PATHS) if r % 2 == 0 else list(PATHS)[::-1]):
                    bound = PATHS[path]
                    times[path].append(1000 * do_bench_cudagraph(lambda b=bound: _align(ids, experts, block_m, b)))
            row = {"shape": shape, "tokens": tokens, "slots": tokens * top_k, "block_m": block_m, "same_list": same,
                   **{f"{path}_us": round(statistics.median(t), 2) for path, t in times.items()},
                   **{f"{path}_us_all": [round(x, 2) for x in t] for path, t in times.items()}}
            print(json.dumps(row), flush=True)
            rows.append(row)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "moe_align_ab.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
