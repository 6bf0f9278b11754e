"""GPU correctness of the Triton path against HF transformers and the torch reference backend.

1. Kernels: Triton vs torch backend on bf16 batches of the 7B / 0.6B head shapes (decode, prefill,
   prefix hits / chunks), max abs diff.
2. Greedy tokens identical to HF generate, fp32 tiny models (qwen2 / qwen3 / llama / qwen3moe / gpt-oss with float32
   and MXFP4 experts, sinks and a 16-token sliding window), Triton backend
   with CUDA graphs, through prefix-cache hits (a second pass) and chunked prefill (16-token budget);
   and a 0.6B-shape fp32 random model, greedy vs HF on the GPU.
3. bf16 first-token logits of the Qwen2-7B shape vs HF (same random weights), max abs diff.
Writes $OUT/correctness.json and prints a table last.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

ROOT = __file__.rsplit("/scripts/", 1)[0]
sys.path.insert(0, ROOT)
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

import torch  # noqa: E402
import transformers  # noqa: E402

from railyard.bench.workload import LengthRange, synthetic_requests  # noqa: E402
from railyard.engine.config import EngineConfig, SamplingParams  # noqa: E402
from railyard.engine.engine import Engine  # noqa: E402
from railyard.engine.llm import LLM  # noqa: E402
from railyard.model.spec import ModelSpec  # noqa: E402
from railyard.shapes import shape_config  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
results: dict = {}
T0 = time.time()


def save():
    with open(os.path.join(OUT, "correctness.json"), "w") as f:
        json.dump(results, f, indent=1)


def kernels():
    from tests.engine.runner.attention.paged_batch import random_batch as _batch
    from railyard.engine.runner.attention.torch_backend import TorchAttentionBackend
    from railyard.engine.runner.attention.triton_backend import TritonAttentionBackend

    rows = []
    cases = {
        "decode 7B heads (28/4), ctx 1-1000": ([0, 5, 200, 999, 17, 511], [1] * 6, 28, 4),
        "decode 0.6B heads (16/8), ctx 1-1000": ([0, 5, 200, 999, 17, 511], [1] * 6, 16, 8),
        "prefill 7B heads, whole prompts": ([0, 0, 0], [1000, 37, 300], 28, 4),
        "prefill 0.6B heads, prefix hits/chunks + decodes": ([64, 512, 3, 700], [300, 77, 1, 1], 16, 8),
    }
    for name, (cached, new, h, hk) in cases.items():
        q, k, v, cache, meta = _batch(cached, new, h, hk, 128, torch.bfloat16, seed=len(name))
        c1, c2 = cache.clone(), cache.clone()
        ref = TorchAttentionBackend(h, hk, 128, 128 ** -0.5).forward(q.float(), k.float(), v.float(), c1.float(), meta)
        got = TritonAttentionBackend(h, hk, 128, 128 ** -0.5).forward(q, k, v, c2, meta)
        err = (got.float() - ref).abs().max().item()
        rows.append({"case": name, "max_abs_diff_vs_fp32_torch": err, "ok": err < 2e-2})
    results["kernels_bf16"] = rows
    save()


def tiny_greedy():
    sys.path.insert(0, ROOT)
    from tests.engine.hf_oracle import hf_greedy
    from railyard.engine.startup.tiny_model import write_tiny_checkpoint
    import random

    rng = random.Random(1234)
    shared = [rng.randrange(256) for _ in range(40)]
    prompts = [[rng.randrange(256) for _ in range(n)] for n in (3, 17, 33, 64, 70, 9, 200)]
    prompts += [shared + [rng.randrange(256) for _ in range(n)] for n in (5, 12)]
    variants = {"prefix-cache bs16 + cuda graphs": dict(block_size=16, max_num_seqs=16),
                "chunked prefill (16-token budget) bs8": dict(block_size=8, max_num_batched_tokens=16, max_num_seqs=16),
                "eager (no graphs)": dict(enforce_eager=True)}
    from tests.engine.gpt_oss_checkpoint import write_tiny_gpt_oss

    rows = []
    paths = {arch: write_tiny_checkpoint(f"/tmp/tiny-{arch}", arch, seed=0)  # qwen3moe: the fused-MoE kernel
             for arch in ("qwen2", "qwen3", "llama", "qwen3moe")}
    # gpt-oss: sinks and sliding windows in the Triton kernels, sliding blocks in the decode graphs, MXFP4 experts
    paths.update({"gpt-oss": write_tiny_gpt_oss("/tmp/tiny-gpt-oss"),
                  "gpt-oss-mxfp4": write_tiny_gpt_oss("/tmp/tiny-gpt-oss-mxfp4", mxfp4=True)})
    for arch, path in paths.items():
        path = str(path)
        expected = hf_greedy(path, prompts, 24)
        for vname, kw in variants.items():
            llm = LLM(path, device="cuda", dtype="float32", attention_backend="triton", max_model_len=512,
                      gpu_memory_utilization=0.3, **kw)
            params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
            got = [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params,
                                                                 use_tqdm=False)]
            again = [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params,
                                                                   use_tqdm=False)]
            st = llm.engine.stats()
            rows.append({"arch": arch, "variant": vname, "identical": got == expected,
                         "identical_with_prefix_hits": again == expected, "prefix_cache_hits": st.prefix_cache_hits,
                         "graphs": llm.engine.executor.runner.graphs is not None})
            del llm
            torch.cuda.empty_cache()
    results["tiny_fp32_greedy_vs_hf"] = rows
    save()


def hf_random(name: str, dtype):
    cfg = transformers.AutoConfig.for_model(**{k: v for k, v in shape_config(name).items()
                                               if k not in ("architectures", "torch_dtype")})
    torch.manual_seed(0)
    with torch.device("cuda"):
        m = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    m.eval()
    for p in m.parameters():
        p.data.normal_(0, 0.02)
    return m


def our_engine(name: str, dtype: str, hf, **kw) -> Engine:
    spec = ModelSpec.from_hf_config(shape_config(name))
    eng = Engine(EngineConfig(model=name, dtype=dtype, device="cuda", attention_backend="triton",
                              max_model_len=4096, gpu_memory_utilization=0.6, **kw), spec=spec)
    loaded = eng.executor.runner.model.load_weights((n, p.data) for n, p in hf.named_parameters())
    assert loaded, "no weights copied"
    return eng


def first_token_logits(eng: Engine, prompts: list[list[int]]) -> torch.Tensor:
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", None, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True),
                        prompt_token_ids=p)
    out = eng.scheduler.schedule()
    assert all(s.sample for s in out.scheduled), "budget too small for one-step prefill"
    runner = eng.executor.runner
    return runner.compute_logits(runner.plan(out)).float()


def qwen2_7b_logits():
    hf = hf_random("qwen2-7b", torch.bfloat16)
    reqs = synthetic_requests(4, LengthRange(100, 1024), LengthRange(1, 1), 152064, 7, 100, 100)
    prompts = [r.prompt_token_ids for r in reqs]
    with torch.no_grad():
        ref = torch.stack([hf(torch.tensor([p], device="cuda")).logits[0, -1].float() for p in prompts])
        ref32 = None
    eng = our_engine("qwen2-7b", "bfloat16", hf, max_num_batched_tokens=8192)
    got = first_token_logits(eng, prompts)
    diff = (got - ref).abs()
    results["qwen2_7b_bf16_first_token_logits"] = {
        "prompts": [len(p) for p in prompts], "max_abs_diff": diff.max().item(), "mean_abs_diff": diff.mean().item(),
        "logit_abs_max": ref.abs().max().item(), "argmax_equal": (got.argmax(-1) == ref.argmax(-1)).tolist()}
    save()
    del eng, hf, ref32
    torch.cuda.empty_cache()


def qwen3_06b_fp32_greedy():
    hf = hf_random("qwen3-0.6b", torch.float32)
    hf.generation_config.eos_token_id = None
    reqs = synthetic_requests(6, LengthRange(20, 300), LengthRange(1, 1), 151936, 3, 100, 100)
    prompts = [r.prompt_token_ids for r in reqs]
    with torch.no_grad():
        expected = []
        for p in prompts:
            x = torch.tensor([p], device="cuda")
            y = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=32, do_sample=False, pad_token_id=0)
            expected.append(y[0, len(p):].tolist())
    eng = our_engine("qwen3-0.6b", "float32", hf)
    for i, p in enumerate(prompts):
        eng.add_request(f"g{i}", None, SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True),
                        prompt_token_ids=p)
    done = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                done[o.request_id] = o.outputs[0].token_ids
    got = [done[f"g{i}"] for i in range(len(prompts))]
    results["qwen3_0.6b_fp32_greedy_vs_hf_gpu"] = {
        "identical": got == expected, "per_prompt_identical": [a == b for a, b in zip(got, expected)],
        "first_divergence": [next((j for j, (a, b) in enumerate(zip(x, y)) if a != b), None)
                             for x, y in zip(got, expected)]}
    save()
    del eng, hf
    torch.cuda.empty_cache()


for step in (tiny_greedy, qwen2_7b_logits, kernels, qwen3_06b_fp32_greedy):
    t = time.time()
    try:
        step()
    except Exception as exc:  # record and go on: one failure must not hide the other checks
        import traceback
        traceback.print_exc()
        results[step.__name__ + "_error"] = repr(exc)[:1000]
        save()
    print(f"== {step.__name__} {time.time() - t:.1f}s", flush=True)

print(json.dumps(results, indent=1))
