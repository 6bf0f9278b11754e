"""Why the MXFP4 experts' grouped GEMM reads its weights below the memory's rate: Nsight Compute on one
`fused_experts` call as the engine runs it (gpt-oss-20b's experts, random packed weights, bf16 activations, the
engine's tile for the token count), both launches of the grouped GEMM (gate/up, then down). Prints one JSON line per
launch: duration, DRAM and L2 figures, occupancy, cycles between a warp's instructions, and the sampled stall
reasons (Nsight's `smsp__pcsamp_warps_issue_stalled_*`, as a share of all samples), largest first.

    TOKENS=256 python3 scripts/dev/moe_kernel_ncu.py            # NCU=/path/to/ncu if it is not on PATH
    TOKENS=1024 EXPERTS=32 python3 scripts/dev/moe_kernel_ncu.py

It runs itself under ncu (`--child`), skipping the warm-up calls' launches (the first compiles the kernels).
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys

ROOT = __file__.rsplit("/scripts/", 1)[0]
WARM_CALLS = 3  # fused_experts calls before the profiled one, each two grouped-GEMM launches
SECTIONS = ("SpeedOfLight", "Occupancy", "MemoryWorkloadAnalysis", "WarpStateStats", "SchedulerStats",
            "LaunchStats", "SourceCounters")
KEPT = {  # raw metric -> name in the output
    "gpu__time_duration.sum": "duration_us",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct_of_peak",
    "dram__bytes.sum.per_second": "dram_bytes_per_s",
    "lts__t_sector_hit_rate.pct": "l2_hit_pct",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed": "l2_pct_of_peak",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_pct_of_peak",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",
    "launch__occupancy_limit_registers": "blocks_per_sm_by_registers",
    "launch__occupancy_limit_shared_mem": "blocks_per_sm_by_shared_memory",
    "launch__registers_per_thread": "registers_per_thread",
    "launch__grid_size": "grid",
    "smsp__average_warp_latency_per_inst_issued.ratio": "cycles_per_issued_instruction",
    "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue_active_pct",
    "smsp__inst_executed.sum": "instructions",
}


def child() -> None:
    """The profiled process: WARM_CALLS + 1 fused_experts calls on gpt-oss-20b's expert shapes."""
    sys.path.insert(0, ROOT)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch
    from moe_sweep import GPT_OSS_ACT, experts  # the sweep's random packed experts, gpt-oss's activation
    from railyard.engine.runner.kernels import fused_moe

    num_experts, hidden, inter, top_k = int(os.environ.get("EXPERTS", "32")), 2880, 2880, 4
    tokens = int(os.environ.get("TOKENS", "256"))
    torch.manual_seed(0)
    w13, w2, s13, s2, b13, b2 = experts("mxfp4", num_experts, hidden, inter)
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    top, ids = torch.topk(torch.randn(tokens, num_experts, device="cuda"), top_k, dim=-1)
    weights = torch.softmax(top, dim=-1).to(torch.bfloat16)
    for _ in range(WARM_CALLS + 1):
        fused_moe.fused_experts(x, w13, w2, weights, ids, GPT_OSS_ACT, b13, b2, s13, s2,
                                widen=fused_moe.widens_mxfp4(tokens * top_k, num_experts), kernel_layout=True)
    torch.cuda.synchronize()


def number(text: str) -> float | str:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return text


def summarize(raw_csv: str) -> list[dict]:
    """ncu's raw page (a header row, a units row, a row per launch) -> the KEPT metrics and the stall shares."""
    rows = list(csv.reader(io.StringIO(raw_csv[raw_csv.index('"ID"'):])))
    header, data = rows[0], [r for r in rows[2:] if len(r) == len(rows[0])]
    launches = []
    for r in data:
        values = dict(zip(header, r))
        out = {"kernel": values.get("Kernel Name", "")[:40]}
        out.update({name: number(values[m]) for m, name in KEPT.items() if m in values})
        if "duration_us" in out and isinstance(out["duration_us"], float):
            out["duration_us"] = round(out["duration_us"] / 1e3, 1)  # base units: nanoseconds
        stalls = {m.removeprefix("smsp__pcsamp_warps_issue_stalled_"): number(v) for m, v in values.items()
                  if m.startswith("smsp__pcsamp_warps_issue_stalled_") and not m.endswith("_not_issued")}
        if not stalls:  # no PC sampling on this profiler: the per-instruction stall cycles of WarpStateStats
            stalls = {m.split("issue_stalled_")[1].split("_per_")[0]: number(v) for m, v in values.items()
                      if m.startswith("smsp__average_warp_latency_issue_stalled_") and m.endswith(".ratio")}
        stalls = {k: v for k, v in stalls.items() if isinstance(v, float) and v > 0}
        total = sum(stalls.values())
        out["stall_share_pct"] = {k: round(100 * v / total, 1) for k, v in
                                  sorted(stalls.items(), key=lambda kv: -kv[1])[:10]} if total else {}
        launches.append(out)
    return launches


def main() -> None:
    if "--child" in sys.argv:
        child()
        return
    ncu = os.environ.get("NCU") or shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    command = [ncu, "--kernel-name", "regex:_grouped_gemm_kernel", "--launch-skip", str(2 * WARM_CALLS),
               "--launch-count", "2", "--clock-control", "none", "--page", "raw", "--csv", "--print-units", "base"]
    for section in SECTIONS:
        command += ["--section", section]
    command += [sys.executable, os.path.abspath(__file__), "--child"]
    done = subprocess.run(command, capture_output=True, text=True)
    out_dir = os.environ.get("OUT")
    if out_dir:  # the raw page, for the metrics this summary leaves out
        with open(os.path.join(out_dir, f"ncu_{os.environ.get('TOKENS', '256')}.csv"), "w") as f:
            f.write(done.stdout[-2_000_000:])
    if done.returncode != 0 or '"ID"' not in done.stdout:
        raise SystemExit(f"moe_kernel_ncu: ncu failed ({done.returncode}): {(done.stderr or done.stdout)[-600:]}")
    for launch, projection in zip(summarize(done.stdout), ("gate_up", "down")):
        print(json.dumps({"tokens": int(os.environ.get("TOKENS", "256")), "projection": projection, **launch}),
              flush=True)


if __name__ == "__main__":
    main()
