"""Where the time goes in the offline benchmark of a named shape: per-step wall time by kind (steps
with prefill vs pure decode), GPU time of one captured decode step at full batch, and the top CUDA
kernels of a prefill window and a decode window (torch.profiler).

Usage: python3 scripts/dev/profile_steps.py qwen2-7b [max_num_batched_tokens] [FIELD=VALUE ...]
    -> $OUT/profile_<model>.txt (with the kernel tables) and $OUT/profile_<model>.json (the numbers)
FIELD=VALUE pairs are more EngineConfig fields (Python literals or strings), e.g. `quantization=fp8
max_num_seqs=256`; with any, the outputs are named profile_<model>_<values joined by _>.txt / .json.
ROWS=N (environment, default 18): the kernels each table lists.
LORAS=N (environment; LORA_RANK, default 16): N random PEFT adapters on every projection, the requests spread over
them evenly (`bench throughput --num-loras`'s workload), so the tables show what LoRA adds to each kind of step.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from railyard.bench.lora import write_random_adapters  # noqa: E402
from railyard.bench.throughput import workload_requests  # noqa: E402
from railyard.engine.engine import Engine  # noqa: E402
from railyard.bench.workload import LengthRange  # noqa: E402
from railyard.engine.config import EngineConfig, SamplingParams  # noqa: E402

name = sys.argv[1]
positional = [a for a in sys.argv[2:] if "=" not in a]
budget = int(positional[0]) if positional else None
def _value(text: str):
    """A field's value: a Python literal (256, True, 0.9) where it reads as one, else the string (fp8)."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


fields = {k: _value(v) for k, v in (a.split("=", 1) for a in sys.argv[2:] if "=" in a)}
run_label = "_".join([os.path.basename(name.rstrip("/"))] + [str(v) for v in fields.values()])  # a shape or a checkpoint dir
OUT = os.environ.get("OUT", "/tmp")
lines: list[str] = []


def say(text: str = "") -> None:
    print(text, flush=True)
    lines.append(text)


num_loras, lora_rank = int(os.environ.get("LORAS", "0")), int(os.environ.get("LORA_RANK", "16"))
if num_loras:
    fields.update(enable_lora=True, max_loras=max(num_loras, 1), max_lora_rank=lora_rank)
    run_label += f"_loras{num_loras}"
eng = Engine.from_config(EngineConfig(model=name, max_num_batched_tokens=budget, **fields))
runner = eng.executor.runner
loras = []
if num_loras:
    adapters_dir = tempfile.mkdtemp(prefix="railyard-profile-loras-")
    loras = write_random_adapters(eng.spec, Path(adapters_dir), num_loras, lora_rank,
                                  dtype=str(runner.dtype).removeprefix("torch."))
reqs = workload_requests(eng, 256, LengthRange(100, 1024), LengthRange(256, 256), 0)
for i, r in enumerate(reqs):
    eng.add_request(f"p{i}", None, SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True),
                    prompt_token_ids=r.prompt_token_ids, lora_request=loras[i % len(loras)] if loras else None)

last = {}
inner = eng.executor.launch


def recorded_launch(out):
    last["decode"] = all(s.num_new_tokens == 1 for s in out.scheduled)
    last["tokens"] = out.num_batched_tokens
    last["seqs"] = len(out.scheduled)
    return inner(out)


eng.executor.launch = recorded_launch
host = {"schedule": 0.0, "mark_computed": 0.0, "plan": 0.0, "sampling_rows": 0.0, "_complete": 0.0}


def timed(obj, attr):
    fn = getattr(obj, attr)

    def wrapper(*a, **kw):
        t = time.perf_counter()
        r = fn(*a, **kw)
        host[attr] += time.perf_counter() - t
        return r
    setattr(obj, attr, wrapper)


for obj, attr in ((eng.scheduler, "schedule"), (eng.scheduler, "mark_computed"), (runner, "plan"),
                  (runner, "sampling_rows"), (eng.core, "_complete")):
    timed(obj, attr)
windows = {"prefill/mixed steps 2-4": (2, 5), "decode steps 150-154": (150, 155)}
stats = {True: [0, 0.0], False: [0, 0.0]}  # kind of the step launched -> steps, wall
prof_tables = {}
step = 0
graph_ms = None
t_all = time.perf_counter()
prof = None
while eng.has_unfinished_requests():
    for label, (a, b) in windows.items():
        if step == a:
            prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            prof.__enter__()
            current = label
    t = time.perf_counter()
    eng.step()
    wall = time.perf_counter() - t
    s = stats[last.get("decode", True)]
    s[0] += 1
    s[1] += wall
    step += 1
    for label, (a, b) in windows.items():
        if step == b and prof is not None:
            if torch.cuda.is_available():  # a CPU dry run profiles the host side only
                torch.cuda.synchronize()
            prof.__exit__(None, None, None)
            prof_tables[label] = prof.key_averages().table(sort_by="cuda_time_total", max_name_column_width=60,
                                                           row_limit=int(os.environ.get("ROWS", "18")))
            prof = None
    if step == 140 and getattr(runner, "graphs", None) is not None and last["decode"]:
        try:
            bs = runner.graphs.padded_size(last["seqs"])
            g = runner.graphs.graphs[bs]
        except (AttributeError, KeyError) as exc:  # another graph layout: the kernel tables still tell
            say(f"no decode graph replay timed ({type(exc).__name__}: {exc})")
        else:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            g.replay()
            e0.record()
            for _ in range(10):
                g.replay()
            e1.record()
            if torch.cuda.is_available():  # a CPU dry run profiles the host side only
                torch.cuda.synchronize()
            graph_ms = (e0.elapsed_time(e1) / 10, last["seqs"], bs)
total = time.perf_counter() - t_all

say(f"# profile of {name} {fields or ''}, 256 prompts 100-1024 tokens, 256 out, max_num_batched_tokens {eng.config.max_num_batched_tokens}")
say(f"total {total:.2f} s over {step} steps (profiled windows included)")
say(f"asynchronous scheduling: {eng.async_scheduling} (a step launches batch N+1, then waits for N's tokens)")
for kind, (n, wall) in stats.items():
    label = "pure decode" if kind else "with prefill"
    if n:
        say(f"{label:13s}: {n:4d} steps launched, wall {wall:6.2f} s ({wall / n * 1e3:6.2f} ms/step)")
say("host time by part over all steps (_complete includes the wait for the device): " + ", ".join(f"{k} {v:.2f} s" for k, v in host.items()))
if graph_ms:
    say(f"decode graph replay alone: {graph_ms[0]:.2f} ms GPU for {graph_ms[1]} sequences (padded to {graph_ms[2]})")
for label, table in prof_tables.items():
    say(f"\n## top CUDA kernels, {label}\n{table}")
with open(os.path.join(OUT, f"profile_{run_label}.txt"), "w") as f:
    f.write("\n".join(lines) + "\n")
summary = {
    "model": name, "config": fields, "max_num_batched_tokens": eng.config.max_num_batched_tokens, "total_s": round(total, 3),
    "steps": step, "async_scheduling": eng.async_scheduling,
    "steps_by_kind": {("pure_decode" if kind else "with_prefill"): {"steps": n, "wall_s": round(wall, 3),
                                                                    "ms_per_step": round(wall / n * 1e3, 2)}
                      for kind, (n, wall) in stats.items() if n},
    "host_s_by_part": {k: round(v, 3) for k, v in host.items()},
    "decode_graph_replay": {"gpu_ms": round(graph_ms[0], 3), "sequences": graph_ms[1], "padded_to": graph_ms[2]}
    if graph_ms else None,
}
with open(os.path.join(OUT, f"profile_{run_label}.json"), "w") as f:
    json.dump(summary, f, indent=1)
