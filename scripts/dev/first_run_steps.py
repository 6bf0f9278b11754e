"""Why the first workload after ready differs from the third: the issue-7 workload three times in one engine (each
run the same lengths, other token ids, as `railyard bench throughput --runs 3`), every step timed with what it ran
(sequences, tokens, decode rows), what the caching allocator did during it (device allocations, retries, frees of
cached blocks), pinned host allocations, and the garbage collector's pauses. The runs share their schedule, so
step i of the first run against step i of the third shows where the first one loses time.

Usage: python3 scripts/dev/first_run_steps.py qwen2-7b [max_num_batched_tokens] -> $OUT/first_run_<model>.json and
a table on stdout (DIFF_MS=10: the steps the first run took that much longer than the third). The runs see the
heap frozen as `railyard bench throughput` and an engine's process have it (FREEZE=0: not).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import time
import traceback
import warnings

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])

import torch  # noqa: E402

from railyard.bench.throughput import workload_requests  # noqa: E402
from railyard.bench.workload import LengthRange  # noqa: E402
from railyard.engine.config import EngineConfig, SamplingParams  # noqa: E402
from railyard.engine.engine import Engine  # noqa: E402
from railyard.engine.startup.gc_heap import frozen_heap  # noqa: E402

name = sys.argv[1]
budget = int(sys.argv[2]) if len(sys.argv) > 2 else 16384
OUT = os.environ.get("OUT", "/tmp")
eng = Engine.from_config(EngineConfig(model=name, max_num_batched_tokens=budget))
cuda = torch.cuda.is_available()

last: dict = {}
inner = eng.executor.launch


def recorded_launch(out):
    last.update(seqs=len(out.scheduled), tokens=out.num_batched_tokens,
                decodes=sum(1 for s in out.scheduled if s.num_new_tokens == 1))
    launched = inner(out)
    if cuda:  # the end of this step's device work: consecutive ends give each step's device time
        ends.append(torch.cuda.Event(enable_timing=True))
        ends[-1].record()
    return launched


eng.executor.launch = recorded_launch
ends: list = []
host: dict[str, float] = {}


def timed(obj, attr: str) -> None:
    fn = getattr(obj, attr)

    def wrapper(*a, **kw):
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            host[attr] = host.get(attr, 0.0) + time.perf_counter() - t
    setattr(obj, attr, wrapper)


for obj, attr in ((eng.scheduler, "schedule"), (eng.executor.runner, "plan"), (eng.executor.runner, "sampling_rows"),
                  (eng.executor.runner, "compute_logits"), (eng.executor.runner, "launch_sample"),
                  (eng.core, "_complete"), (eng.processor, "process_step")):
    timed(obj, attr)
gc_pauses: list[tuple[int, float]] = []
gc_start = [0.0]


def on_gc(phase: str, info: dict) -> None:
    if phase == "start":
        gc_start[0] = time.perf_counter()
    else:
        gc_pauses.append((info["generation"], time.perf_counter() - gc_start[0]))


gc.callbacks.append(on_gc)


def allocator() -> dict[str, int]:
    if not cuda:
        return {}
    s = torch.cuda.memory_stats()
    keys = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams")
    out = {k: s.get(k, 0) for k in keys}
    try:
        h = torch.cuda.host_memory_stats()
        out["num_host_alloc"] = h.get("num_host_alloc", 0)
    except (AttributeError, RuntimeError):
        pass
    return out


syncs: list[str] = []  # where a step's host waited on the device (torch's sync debug mode), first steps only


def on_warning(message, category, filename, lineno, file=None, line=None) -> None:
    if "synchronizing" in str(message):
        frames = [f for f in traceback.extract_stack()[:-1] if "/railyard/" in f.filename]
        syncs.append(" < ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}" for f in frames[-3:][::-1]))


warnings.showwarning = on_warning
warnings.simplefilter("always")
if cuda and os.environ.get("PROBE"):  # the logits GEMM at every row count once, each first call against a second
    runner = eng.executor.runner
    hidden = torch.randn(eng.config.max_num_seqs, eng.spec.hidden_size, dtype=runner.dtype, device=runner.device)
    slow = []
    with torch.inference_mode():
        for m in range(1, eng.config.max_num_seqs + 1):
            took = []
            for _ in range(2):
                torch.cuda.synchronize()
                t = time.perf_counter()
                runner.model.compute_logits(hidden[:m])
                torch.cuda.synchronize()
                took.append((time.perf_counter() - t) * 1000)
            if took[0] - took[1] > 1.0:
                slow.append((m, round(took[0], 1), round(took[1], 1)))
    print(f"logits rows whose first call was > 1 ms slower than the second: {len(slow)}: {slow[:40]}")
if cuda and os.environ.get("PROBE_GEMM"):  # layer 0's projections at token counts above the piecewise graphs'
    runner = eng.executor.runner
    mods = [m for m in runner.model.model.layers[0].modules() if hasattr(m, "_matmul") and hasattr(m, "weight")]
    lo = runner.piecewise.max_tokens + 1 if runner.piecewise is not None else 1
    sizes = list(range(lo, eng.config.max_num_batched_tokens + 1, int(os.environ["PROBE_GEMM"])))
    x = torch.randn(eng.config.max_num_batched_tokens, max(m.weight.shape[1] for m in mods), dtype=runner.dtype,
                    device=runner.device)
    slow = []
    with torch.inference_mode():
        for m in sizes:
            for mod in mods:
                took = []
                for _ in range(2):
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                    mod._matmul(x[:m, :mod.weight.shape[1]], None)
                    torch.cuda.synchronize()
                    took.append((time.perf_counter() - t) * 1000)
                if took[0] - took[1] > 1.0:
                    slow.append((m, tuple(mod.weight.shape), round(took[0], 1), round(took[1], 1)))
    print(f"GEMM token counts {lo}..: {len(sizes)} probed, {len(slow)} first calls > 1 ms slower than the second: "
          f"{slow[:60]}")
runs = []
with frozen_heap() if os.environ.get("FREEZE", "1") == "1" else contextlib.nullcontext():
    for k in range(3):
        reqs = workload_requests(eng, int(os.environ.get("PROMPTS", "256")), LengthRange(100, 1024), LengthRange(256, 256), 0,
                                 repeat=k)
        for i, r in enumerate(reqs):
            eng.add_request(f"r{k}-{i}", None, SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True,
                                                              output_kind="final_only"),
                            prompt_token_ids=r.prompt_token_ids)
        gc_pauses.clear()
        steps = []
        t0 = time.perf_counter()
        before_run = allocator()
        ends.clear()
        while eng.has_unfinished_requests():
            a = allocator()
            modules = set(sys.modules)
            host.clear()
            syncs.clear()
            watch = cuda and len(steps) < 12
            if watch:
                torch.cuda.set_sync_debug_mode(1)
            t = time.perf_counter()
            eng.step()
            wall = time.perf_counter() - t
            if watch:
                torch.cuda.set_sync_debug_mode(0)
            b = allocator()
            new_modules = sorted(set(sys.modules) - modules)
            steps.append({"wall_ms": round(wall * 1000, 2), **last, **{k2: b[k2] - a[k2] for k2 in b if b[k2] != a[k2]},
                          "host_ms": {k2: round(v * 1000, 1) for k2, v in host.items() if v >= 0.002},
                          **({"imported": new_modules[:5] + [f"... {len(new_modules)}"]} if new_modules else {}),
                          **({"syncs": sorted(set(syncs))} if syncs else {})})
        elapsed = time.perf_counter() - t0
        if cuda:
            torch.cuda.synchronize()
            for i in range(1, min(len(ends), len(steps))):
                steps[i]["device_ms"] = round(ends[i - 1].elapsed_time(ends[i]), 2)
        after_run = allocator()
        runs.append({"elapsed_s": round(elapsed, 3), "steps": steps,
                     "allocator": {k2: after_run[k2] - before_run[k2] for k2 in after_run},
                     "gc": {g: [round(sum(p for gg, p in gc_pauses if gg == g) * 1000, 2),
                                sum(1 for gg, _ in gc_pauses if gg == g)] for g in (0, 1, 2)}})
        slow = sorted(range(len(steps)), key=lambda i: -steps[i]["wall_ms"])[:8]
        print(f"run {k + 1}: {elapsed:.3f} s, {len(steps)} steps, allocator {runs[-1]['allocator']}, "
              f"gc ms/count by generation {runs[-1]['gc']}")
        for i in sorted(slow):
            print(f"  step {i}: {steps[i]}")

first, third = runs[0]["steps"], runs[2]["steps"]
DIFF_MS = float(os.environ.get("DIFF_MS", "10"))
print(f"steps where the first run took >= {DIFF_MS} ms longer than the third:")
for i in range(min(len(first), len(third))):
    if first[i]["wall_ms"] - third[i]["wall_ms"] >= DIFF_MS:
        print(f"  step {i}: first {first[i]}  third {third[i]}")
with open(os.path.join(OUT, f"first_run_{os.path.basename(name)}.json"), "w") as f:
    json.dump(runs, f)
