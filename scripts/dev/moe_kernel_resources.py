"""Registers, spills, shared memory and global-load widths of the fused-MoE grouped GEMM (kernels/fused_moe.py) per
tile, bf16 and MXFP4 weights, compiled for sm_90 on a machine without a GPU (Triton's bundled ptxas and cuobjdump).

Why: the MXFP4 tiles are widened in registers, so how they load decides what the kernel costs; masks that Triton
cannot prove constant over 16 bytes turn the packed weights' loads into one byte-wise load per byte (LDG.E.U8)
instead of pipelined 16-byte asynchronous copies (LDGSTS...128). A row with byte-wise loads beyond the exponents'
few is that regression. Shapes: gpt-oss's gate/up GEMM (N 5760, K 2880), or with --projection down its down GEMM
(each slot's own activation row; fused_experts applies the routing weights in sum_slots, not in this epilogue).

The K loop's instruction count per thread is the widening's cost in an MXFP4 tile: issued per weight, it caps how
fast a tile can read the packed weights while the experts stream (decode); at the engine's tiles the cap is not
what binds (scripts/dev/mxfp4_moe_gluon.py times the same GEMM without its widening). "MMAs serialized" is ptxas's
C7515 note: it waits for each wgmma before the next instead of keeping them in flight beside the widening (the
4-warp 64-row MXFP4 tiles, whose warpgroups hold two accumulators, get it with the exponents loaded a step ahead).

"MMA overlap" is how many instructions a thread issues between each wgmma and the wait for it (the fewest and the
median over the kernel's wgmmas): near 0, the tensor cores' latency is the thread's; ~30, the next fragment's
widening runs while the MMA does.

Usage: python3 scripts/dev/moe_kernel_resources.py   (one line per tile of fused_moe.py's tables; triton, no GPU;
       KERNEL_LAYOUT=0: MXFP4 bytes in checkpoint order rather than the kernel's, layers/mxfp4.py;
       HALF_ROWS=0: without the half-height path of row blocks filled at most halfway;
       GATED=0: the MXFP4 gate/up GEMM storing its projection rather than gpt-oss's activation of it;
       MUL_WEIGHT=1: the routing weight multiplied in the epilogue, which grouped_gemm still offers)
       python3 scripts/dev/moe_kernel_resources.py --tiles "64,128,64,8,4;64,128,64,8,4,80"   (MXFP4 tiles by
       hand; a sixth number caps the registers a thread may hold; --projection down: the down GEMM)
"""

from __future__ import annotations

import argparse
import collections
import inspect
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import decode_kernel_resources  # noqa: E402 (its cuobjdump readers)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import get_ptxas  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from moe_sweep import GPT_OSS_ACT  # noqa: E402 (gpt-oss's activation, as the sweeps run it)
from railyard.engine.runner.kernels import fused_moe  # noqa: E402
from railyard.engine.runner.layers.mxfp4 import GROUP  # noqa: E402

ARGS = ("a_ptr", "b_ptr", "c_ptr", "a_scale_ptr", "b_scale_ptr", "bias_ptr", "weights_ptr", "sorted_ptr",
        "block_expert_ptr", "padded_len_ptr", "N", "K", "num_slots", "stride_am", "stride_be", "stride_bn",
        "stride_cm", "stride_asm", "stride_bse", "stride_bsn", "stride_biase", "SPLIT_N", "SPLIT_BLOCKS", "alpha",
        "limit")
FLOATS = {"alpha", "limit"}  # the epilogue activation's constants
# what Triton specialises as 16-divisible at run time for gpt-oss (the exponents' row stride, K / 32 = 90, is not)
DIVISIBLE = {"N", "K", "stride_am", "stride_be", "stride_bn", "stride_cm"}
LOADS = re.compile(r"\b(LDG(?:STS)?[.\w]*)")
# shared-memory traffic and the tensor-core instructions (the widened MXFP4 tile is stored to shared memory, where the
# MMA reads its right operand)
KERNEL_LAYOUT = os.environ.get("KERNEL_LAYOUT", "1") == "1"  # 0: MXFP4 bytes in checkpoint order
HALF_ROWS = os.environ.get("HALF_ROWS", "1") == "1"  # 0: MXFP4 row blocks always multiply all their rows
GATED = os.environ.get("GATED", "1") == "1"  # 0: the MXFP4 gate/up GEMM without gpt-oss's activation in its epilogue
MUL_WEIGHT = os.environ.get("MUL_WEIGHT", "0") == "1"  # 1: grouped_gemm's `weights`, which fused_experts leaves out
MXFP4_TMA = os.environ.get("MXFP4_TMA", "1") == "1"  # 0: packed MXFP4 tiles by pointers where the TMA serves
SHARED = re.compile(r"\b(STS|LDS|LDSM|HGMMA|HMMA)[.\w]*")
ADDRESS = re.compile(r"/\*([0-9a-f]{4,})\*/")
OPCODE = re.compile(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9]*(?:\.[A-Z0-9_]+)*)")
BACK_BRANCH = re.compile(r"\bBRA (?:`\()?0x([0-9a-f]+)")


def opcodes(lines: list[str]) -> list[str]:
    """The opcodes of the SASS lines that hold an instruction, in order."""
    return [m.group(1) for line in lines if (m := OPCODE.search(line))]


def k_loop(sass: str) -> collections.Counter:
    """The instructions of the K loop (the body of the first backward branch) by opcode: what a thread issues per K
    step, widening included."""
    for line in sass.splitlines():
        at, to = ADDRESS.search(line), BACK_BRANCH.search(line)
        if at and to and int(to.group(1), 16) < int(at.group(1), 16):
            start, end = int(to.group(1), 16), int(at.group(1), 16)
            break
    else:
        return collections.Counter()
    body = [line for line in sass.splitlines() if (at := ADDRESS.search(line)) and start <= int(at.group(1), 16) <= end]
    return collections.Counter(opcodes(body))


def compile_gemm(mxfp4: bool, tile: tuple[int, ...], down: bool = False):
    bm, bn, bk, warps, stages, *cap = tile
    weight = "*u8" if mxfp4 else "*bf16"
    pointers = {"b_ptr": weight, "b_scale_ptr": weight, "sorted_ptr": "*i32", "block_expert_ptr": "*i32",
                "padded_len_ptr": "*i32"}
    signature = {a: pointers.get(a, "*bf16") if a.endswith("_ptr") else "fp32" if a in FLOATS else "i32"
                 for a in ARGS if a in fused_moe._grouped_gemm_kernel.arg_names}
    constexprs = dict(A_ROW_DIV=1 if down else 4, FP8=False, MXFP4=mxfp4, HAS_BIAS=True, MUL_WEIGHT=MUL_WEIGHT,
                      DOT_PRECISION="tf32",
                      BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SCALE_N=128, GROUP_M=8, GROUP=GROUP)
    if "EVEN_K" in fused_moe._grouped_gemm_kernel.arg_names:
        constexprs["EVEN_K"] = True  # gpt-oss's K (2880) is whole K steps
    if "KERNEL_LAYOUT" in fused_moe._grouped_gemm_kernel.arg_names:
        constexprs["KERNEL_LAYOUT"] = mxfp4 and KERNEL_LAYOUT  # the bytes as the engine holds them
    if "HALF_ROWS" in fused_moe._grouped_gemm_kernel.arg_names:
        constexprs["HALF_ROWS"] = mxfp4 and bm >= 32 and HALF_ROWS  # as grouped_gemm passes it
    if "GATED" in fused_moe._grouped_gemm_kernel.arg_names:  # gpt-oss's gate/up GEMM, as fused_experts runs it
        kind = fused_moe.epilogue_activation(GPT_OSS_ACT)[0]  # gpt-oss's activation, as launched
        constexprs["GATED"] = kind if mxfp4 and GATED and not down else 0
    if "b_desc" in fused_moe._grouped_gemm_kernel.arg_names:  # weights through a TMA descriptor, as launched
        split = 2 if constexprs.get("GATED") else 1
        if mxfp4:  # packed bytes in the kernel layout, in short row blocks (MXFP4_TMA=0: by pointers)
            tma = KERNEL_LAYOUT and MXFP4_TMA and bm <= getattr(fused_moe, "MXFP4_TMA_BLOCK_M", 0)
            box = f"u8[1, {split}, {bn // split}, {bk // 2}]"
        else:
            tma = bm >= fused_moe.TMA_BLOCK_M
            box = f"bf16[1, {split}, {bn // split}, {bk}]"
        constexprs["B_TMA"] = tma
        if tma:
            signature["b_desc"] = f"tensordesc<{box}>"
        else:
            constexprs["b_desc"] = None
    signature.update({name: "constexpr" for name in constexprs})
    missing = [p.name for p in fused_moe._grouped_gemm_kernel.params if p.name not in signature
               and not (p.is_constexpr and p.default is not inspect.Parameter.empty)]
    if missing:  # a kernel argument this script does not know would shift every later one
        raise SystemExit(f"moe_kernel_resources: no signature for the kernel's {missing}")
    names = [a for a in fused_moe._grouped_gemm_kernel.arg_names if a in signature]
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(names) if a.endswith("_ptr") or a in DIVISIBLE}
    source = ASTSource(fn=fused_moe._grouped_gemm_kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": warps, "num_stages": stages, **({"maxnreg": cap[0]} if cap else {})}
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def mmas_serialized(kernel) -> bool:
    """Whether ptxas serializes the kernel's wgmma instructions (its C7515 note, compiling the PTX for sm_90a)."""
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "kernel.ptx")
        with open(ptx, "w") as f:
            f.write(kernel.asm["ptx"])
        command = [get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", ptx, "-o", os.path.join(tmp, "k.cubin")]
        run = subprocess.run(command, capture_output=True, text=True, check=True)
    return "C7515" in run.stdout + run.stderr


def mma_overlap(sass: str) -> list[int]:
    """For each wgmma (HGMMA) in program order, the instructions issued before the next wait on the wgmma group
    (WARPGROUP.DEPBAR) or the next wgmma."""
    ops = opcodes(sass.splitlines())
    gaps = []
    for i, op in enumerate(ops):
        if op.startswith("HGMMA"):
            j = i + 1
            while j < len(ops) and not ops[j].startswith(("WARPGROUP.DEPBAR", "HGMMA")):
                j += 1
            gaps.append(j - i - 1)
    return gaps


def resources(kernel) -> tuple[int, int, dict[str, int], dict[str, int], collections.Counter, list[int]]:
    """(registers per thread, local-memory spill instructions, global load instructions by kind, shared-memory and
    tensor-core instructions by kind, the K loop's instructions by opcode, each wgmma's overlap) from the cubin."""
    registers, spills = decode_kernel_resources.resources(kernel)
    sass = decode_kernel_resources.cubin_dump(kernel)[1]
    return registers, spills, dict(collections.Counter(LOADS.findall(sass))), dict(collections.Counter(
        SHARED.findall(sass))), k_loop(sass), mma_overlap(sass)


def parse_tiles(text: str) -> tuple[tuple[int, ...], ...]:
    """--tiles' "a,b,c,w,s[,maxnreg];..." as tiles of five or six positive integers."""
    tiles = []
    for part in text.split(";"):
        try:
            tile = tuple(int(x) for x in part.split(","))
        except ValueError:
            tile = ()
        if len(tile) not in (5, 6) or min(tile) < 1:
            raise argparse.ArgumentTypeError(f"tile {part!r} is not BLOCK_M,BLOCK_N,BLOCK_K,warps,stages"
                                             "[,max registers] in positive integers")
        tiles.append(tile)
    return tuple(tiles)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiles", type=parse_tiles,
                        help="MXFP4 tiles instead of the tables: "
                             "BLOCK_M,BLOCK_N,BLOCK_K,warps,stages[,max registers];...")
    parser.add_argument("--projection", choices=("gate_up", "down"), default="gate_up",
                        help="the GEMM compiled, as fused_experts launches it")
    args = parser.parse_args()
    tables = {False: fused_moe.TILES + ((None, fused_moe.LARGE),),
              True: fused_moe.MXFP4_TILES + ((None, fused_moe.MXFP4_LARGE),)}
    if args.tiles:
        tables = {True: tuple((None, tile) for tile in args.tiles)}
    for mxfp4, table in tables.items():
        for _, tile in table:
            kernel = compile_gemm(mxfp4, tile, args.projection == "down")
            regs, spills, loads, shared, loop, gaps = resources(kernel)
            weights = tile[1] * tile[2] // (32 * tile[3])  # a thread's share of a K step's weight tile
            serialized = "MMAs serialized, " if mmas_serialized(kernel) else ""
            overlap = f"MMA overlap {min(gaps)} / {statistics.median(gaps):g}, " if gaps else ""
            print(f"{'mxfp4' if mxfp4 else 'bf16 '} tile {tile}: {regs:3d} registers, {spills} spill instructions, "
                  f"{serialized}{overlap}"
                  f"{kernel.metadata.shared:6d} B shared, loads {loads}, shared/MMA {shared}; K loop "
                  f"{sum(loop.values())} instructions a thread for {weights} weights, most "
                  f"{dict(loop.most_common(6))}", flush=True)


if __name__ == "__main__":
    main()
