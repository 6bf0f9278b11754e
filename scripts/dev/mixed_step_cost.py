"""What a prompt costs the decodes it joins: the same prefills arriving one per step apart (spread, as behind a
router's hops or Poisson traffic) against arriving together (a cohort, as a closed loop of equal-length
requests brings them), on one engine with running decodes.

Each window runs STEPS engine steps with ROWS decodes running (prompts of the same lengths, long outputs, EOS
ignored) and adds PROMPTS prompts of the serving workload's lengths (100-1024, max_tokens 1, so they leave after their
prefill): `base` adds none, `spread` one every STEPS // PROMPTS steps, `pairs` two every twice that, `cohort` all
at step 0. Every window gets new tokens (no prefix-cache hits). A prompt's cost is the window's wall time beyond
the same repetition's base window (per step), over PROMPTS. Variants (AB=1, the default): `split` (a mixed
step's leading decodes in the decode kernel, the prompts alone in the prefill kernel)
and `together` (all in the prefill kernel), each on new decodes (of DECODE_LEN prompt tokens if set),
interleaved REPS times. Then a torch.profiler window of one
prompt's steps: GPU kernel time against the steps' wall time and the top kernels.

Usage: python3 scripts/dev/mixed_step_cost.py [MODEL] [FIELD=VALUE ...]   (default qwen3-0.6b)
    env: ROWS (default 32), PROMPTS (32), STEPS (128), REPS (3), AB (1), DECODE_LEN (0), OUT (default /tmp)
    -> $OUT/mixed_step_cost_<model>_rows<ROWS>[_ctx<DECODE_LEN>].json and .txt
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])

import torch  # noqa: E402

import railyard.engine.runner.attention.triton_backend as backend  # noqa: E402
from railyard.engine.config import EngineConfig, SamplingParams  # noqa: E402
from railyard.engine.engine import Engine  # noqa: E402

MODEL = next((a for a in sys.argv[1:] if "=" not in a), "qwen3-0.6b")
FIELDS = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
ROWS, PROMPTS = int(os.environ.get("ROWS", 32)), int(os.environ.get("PROMPTS", 32))
STEPS, REPS = int(os.environ.get("STEPS", 128)), int(os.environ.get("REPS", 3))
DECODE_LEN = int(os.environ.get("DECODE_LEN", 0))  # the decodes' prompt tokens (0: the prompts' lengths)
OUT = os.environ.get("OUT", "/tmp")
KINDS = ("base", "spread", "pairs", "cohort")
lines: list[str] = []


def say(text: str = "") -> None:
    print(text, flush=True)
    lines.append(text)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def config() -> EngineConfig:
    defaults = dict(max_model_len=8192, max_num_seqs=256, max_num_batched_tokens=8192)
    if torch.cuda.is_available():
        defaults["num_gpu_blocks"] = 16384
    else:  # a CPU dry run on the embedded tiny model
        defaults.update(device="cpu", dtype="float32", max_model_len=1024, num_gpu_blocks=1024)
    return EngineConfig(model=MODEL, **{**defaults, **FIELDS})


eng = Engine.from_config(config())
vocab = eng.spec.vocab_size
rng = random.Random(0)
cap = min(1024, eng.config.max_model_len // 4)
lengths = [rng.randint(min(100, cap), cap) for _ in range(PROMPTS)]
decode_params = SamplingParams(temperature=0.0, max_tokens=eng.config.max_model_len - 600, ignore_eos=True)
prefill_params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
decoders: list[str] = []


def random_prompt(n: int) -> list[int]:
    """n random token ids, new every time: nothing hits the prefix cache."""
    return [rng.randrange(10, min(vocab, 30000)) for _ in range(n)]


def step_until_prefilled() -> int:
    """Steps until no prompt is waiting or part-way computed; how many."""
    steps = 0
    while eng.scheduler.waiting or any(s.num_uncomputed_tokens > 1 for s in eng.scheduler.running):
        eng.step()
        steps += 1
    return steps


def fresh_decoders() -> None:
    """ROWS new decodes of the same prompt lengths (the old ones aborted): every variant's windows see contexts
    of the benchmark's size (prompt + a few hundred tokens), not ones grown over the whole run."""
    global counter
    for request_id in decoders:
        eng.abort(request_id)
    decoders.clear()
    for i in range(ROWS):
        counter += 1
        decoders.append(f"d{counter}")
        eng.add_request(decoders[-1], None, decode_params,
                        prompt_token_ids=random_prompt(DECODE_LEN or lengths[i % PROMPTS]))
    step_until_prefilled()
    for _ in range(8):
        eng.step()


counter = 0
launched: list[bool] = []  # per launched batch: whether it carried a prompt
inner = eng.executor.launch


def recorded_launch(out):
    launched.append(any(s.num_new_tokens > 1 for s in out.scheduled))
    return inner(out)


eng.executor.launch = recorded_launch


def schedule_of(kind: str) -> dict[int, list[int]]:
    """Window step -> indices of the prompts added before it."""
    if kind == "base":
        return {}
    if kind == "cohort":
        return {0: list(range(PROMPTS))}
    group = 2 if kind == "pairs" else 1
    every = max(1, STEPS * group // PROMPTS)
    return {k * every: list(range(k * group, min(PROMPTS, (k + 1) * group))) for k in range(-(-PROMPTS // group))}


def window(kind: str) -> dict:
    """STEPS steps with kind's arrivals, then steps until the added prompts are done; the wall time of all."""
    global counter
    plan = schedule_of(kind)
    fresh = [random_prompt(n) for n in lengths]
    launched.clear()
    sync()
    t0 = time.perf_counter()
    for step in range(STEPS):
        for i in plan.get(step, []):
            counter += 1
            eng.add_request(f"p{counter}", None, prefill_params, prompt_token_ids=fresh[i])
        eng.step()
    steps = STEPS + step_until_prefilled()
    sync()
    wall = time.perf_counter() - t0
    return {"wall_ms": round(wall * 1e3, 2), "steps": steps, "prompt_steps": sum(launched)}


split_default = backend.SPLIT_MIXED_STEPS
VARIANTS = ("split", "together") if os.environ.get("AB", "1") != "0" else ("split",)
results: dict[str, dict[str, list[dict]]] = {v: {k: [] for k in KINDS} for v in VARIANTS}
for rep in range(REPS):
    for variant in VARIANTS:
        backend.SPLIT_MIXED_STEPS = variant == "split"
        fresh_decoders()
        for kind in KINDS:
            results[variant][kind].append(window(kind))
backend.SPLIT_MIXED_STEPS = split_default
summary = {"model": MODEL, "fields": FIELDS, "rows": ROWS, "prompts": PROMPTS, "prompt_tokens": sum(lengths),
           "steps": STEPS, "reps": REPS, "variants": {}}
say(f"# {MODEL} {FIELDS or ''}: {ROWS} decodes, {PROMPTS} prompts of {min(lengths)}-{max(lengths)} tokens "
    f"({sum(lengths)} in all), {STEPS}-step windows x {REPS}; split: a mixed step's decodes in the decode kernel, "
    f"together: in the prefill kernel with the prompts")
for variant in VARIANTS:
    rows = summary["variants"][variant] = {}
    bases = results[variant]["base"]
    for kind in KINDS:
        runs = results[variant][kind]
        # Per step, the decodes cost what they cost in the same repetition's base window (per-step walls would
        # not do: under asynchronous scheduling the step after one with a prompt waits for it).
        extra = [round((r["wall_ms"] - b["wall_ms"] * r["steps"] / b["steps"]) / PROMPTS, 3)
                 for r, b in zip(runs, bases)]
        rows[kind] = {"wall_ms": [r["wall_ms"] for r in runs], "steps": [r["steps"] for r in runs],
                      "prompt_steps": [r["prompt_steps"] for r in runs], "extra_ms_per_prompt": extra}
        say(f"{variant:8s} {kind:7s}: windows {[r['wall_ms'] for r in runs]} ms ({[r['steps'] for r in runs]} steps, "
            f"{[r['prompt_steps'] for r in runs]} with prompts); a prompt adds {extra} ms")

if torch.cuda.is_available():
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        sync()
        t0 = time.perf_counter()
        counter += 1
        eng.add_request(f"p{counter}", None, prefill_params, prompt_token_ids=random_prompt(lengths[0]))
        for _ in range(4):
            eng.step()
        sync()
        wall = time.perf_counter() - t0
    events = prof.key_averages()
    gpu_us = sum(e.self_device_time_total for e in events)
    summary["profile_one_prompt_4_steps"] = {"wall_ms": round(wall * 1e3, 3), "gpu_kernel_ms": round(gpu_us / 1e3, 3),
                                            "prompt_tokens": lengths[0]}
    say(f"\nprofiled: one {lengths[0]}-token prompt joining, 4 steps: wall {wall * 1e3:.2f} ms, "
        f"GPU kernels {gpu_us / 1e3:.2f} ms")
    say(events.table(sort_by="self_device_time_total", row_limit=20, max_name_column_width=60))
    say(events.table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=60))

name = f"{MODEL.rsplit('/', 1)[-1]}_rows{ROWS}" + (f"_ctx{DECODE_LEN}" if DECODE_LEN else "")
with open(os.path.join(OUT, f"mixed_step_cost_{name}.json"), "w") as f:
    json.dump({**summary, "windows": results}, f, indent=1)
with open(os.path.join(OUT, f"mixed_step_cost_{name}.txt"), "w") as f:
    f.write("\n".join(lines) + "\n")
eng.shutdown()
