"""Registers, spills and shared memory of the paged decode kernel per launch configuration, compiled for sm_90
on a machine without a GPU (Triton's bundled ptxas and cuobjdump), and how many of its programs fit on one SM.

Why: over an FP8 cache the decode kernel ran at 1.7 TB/s where the bf16 one reaches 3.1-3.8 (docs/lab-notes,
FP8); compiled here it takes 145 registers a thread against bf16's 96, so three programs share an SM where
bf16 has five. A register cap (`maxnreg`) or narrower tiles trade that back; scripts/dev/tune_decode.py fp8 times
the candidates on the GPU.

Usage: python3 scripts/dev/decode_kernel_resources.py   (prints one line per configuration; needs triton, no GPU)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from railyard.engine.runner.kernels import paged_attention  # noqa: E402

SM_REGISTERS, SM_SHARED, SM_WARPS = 65536, 227 * 1024, 64  # H100 / H200 (sm_90)
QWEN2_7B = dict(NUM_HEADS=28, NUM_KV_HEADS=4, GROUP=7, G_PAD=16, HEAD_DIM=128, D_PAD=128, PAGE=16)
POINTER_OR_STRIDE = (0, 1, 2, 3, 4, 5, 6, 9, 10, 11, 12, 14)  # Triton specialises these as 16-divisible at run time


def compile_decode(cache: str, block_n: int, warps: int, stages: int, maxnreg: int | None):
    signature = {"q_ptr": "*bf16", "cache_ptr": f"*{cache}", "block_tables_ptr": "*i32", "seq_lens_ptr": "*i32",
                 "part_acc_ptr": "*fp32", "part_ml_ptr": "*fp32", "out_ptr": "*bf16", "qk_scale": "fp32",
                 "v_scale": "fp32", "q_stride_t": "i32", "q_stride_h": "i32", "out_stride_t": "i32",
                 "out_stride_h": "i32", "bt_stride": "i32", "plane_stride": "i32", "num_splits": "i32"}
    fp8 = cache == "fp8e4nv"
    constexprs = dict(QWEN2_7B, BLOCK_N=block_n, IEEE=False, DIRECT=True, SCALE_V=fp8, F16_DOTS=fp8,
                      V_TOKENS_INNER=fp8, WINDOW=0, HAS_SINKS=False)  # full attention, no sinks (qwen2)
    signature["sinks_ptr"] = "constexpr"
    constexprs["sinks_ptr"] = None
    signature.update({name: "constexpr" for name in constexprs})
    attrs = {(i,): [["tt.divisibility", 16]] for i in POINTER_OR_STRIDE}
    options = {"num_warps": warps, "num_stages": stages, **({} if maxnreg is None else {"maxnreg": maxnreg})}
    source = ASTSource(fn=paged_attention._decode_split_kernel, signature=signature, constexprs=constexprs,
                       attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def cubin_dump(kernel) -> tuple[str, str]:
    """(cuobjdump's resource usage, the SASS) of a compiled kernel's cubin."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    return usage, sass


def resources(kernel) -> tuple[int, int]:
    """(registers per thread, local-memory spill instructions) from the cubin."""
    usage, sass = cubin_dump(kernel)
    return int(re.search(r"REG:(\d+)", usage).group(1)), len(re.findall(r"\b(?:STL|LDL)\b", sass))


def programs_per_sm(registers: int, shared: int, warps: int) -> int:
    per_warp = -(-registers * 32 // 256) * 256  # allocated per warp in units of 256 registers
    return min(SM_REGISTERS // per_warp // warps, SM_SHARED // max(shared, 1), SM_WARPS // warps)


def main() -> None:
    configs = [("bf16", 64, 4, 2, None), ("bf16", 32, 4, 2, None)]
    configs += [("fp8e4nv", bn, 4, st, cap) for bn in (32, 64) for st in (2, 3) for cap in (None, 128, 104, 96)]
    for cache, block_n, warps, stages, cap in configs:
        kernel = compile_decode(cache, block_n, warps, stages, cap)
        regs, spills = resources(kernel)
        shared = kernel.metadata.shared
        print(f"{cache:8s} BLOCK_N={block_n:3d} warps={warps} stages={stages} maxnreg={str(cap):4s}: "
              f"{regs:3d} registers, {spills:2d} spill instructions, {shared:6d} B shared -> "
              f"{programs_per_sm(regs, shared, warps)} programs per SM", flush=True)


if __name__ == "__main__":
    main()
