"""Ready means ready at full speed: once an engine is built (what /health's first 200 waits for), a workload that
spans its limits compiles or loads no Triton kernel and captures no CUDA graph, from an empty kernel cache.

The workload: 1 to max_num_seqs sequences, steps up to max_num_batched_tokens (beyond the piecewise graphs too),
contexts up to max_model_len, every kind of sampling row, structured outputs beside unconstrained rows, prefix
hits, and preemption (recompute in bf16, swap over an FP8 cache with FP8 weights); the same over a mixture of
experts, over gpt-oss's MXFP4 experts and sliding-window layers, and with LoRA adapters beside the base model.
Oracle: Triton's own cache hook (startup/jit_watch.py counts every kernel it is about to compile or load) and torch's
graph capture entry point. GPU only: on the CPU nothing
compiles and nothing is captured."""

from __future__ import annotations

import random

import pytest
import torch

from railyard.engine.config import SamplingParams
from railyard.engine.llm import LLM
from railyard.engine.lora.request import LoRARequest
from railyard.engine.startup.jit_watch import first_jit_after_ready, jit_after_ready
from railyard.engine.startup.tiny_model import write_tiny_checkpoint
from railyard.engine.structured import StructuredOutputsParams
from tests.engine.gpt_oss_checkpoint import TINY, write_tiny_gpt_oss

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton kernels and CUDA graphs need a GPU")

# Small enough to start in seconds, large enough that every regime exists: decode graphs up to 32 rows, piecewise
# graphs up to 2,048 tokens and eager steps beyond them, head_dim 128 (the FP8 cache's tensor-core decode kernel).
LIMITS = dict(max_num_seqs=32, max_num_batched_tokens=4096, max_model_len=4096, block_size=16,
              num_gpu_blocks=400)  # 32 sequences of ~600 tokens need more: preemption
# case -> (checkpoint, engine options, adapters): the dense model in bf16 and in FP8, the mixture of experts, LoRA
# (on bf16 and on FP8 weights)
CASES = {"bf16": ("dense", dict(), 0),
         "fp8": ("dense", dict(quantization="fp8", kv_cache_dtype="fp8", preemption_mode="swap", num_cpu_blocks=1024),
                 0),
         "moe": ("moe", dict(), 0),
         # gpt-oss: MXFP4 experts on bf16 activations, sinks, sliding-window layers beside full ones
         # (512 blocks: the fewest that hold max_model_len, its full layers' blocks and a whole-prompt chunk's
         # sliding ones; the 32-sequence batch then preempts)
         "gpt-oss": ("gpt-oss", dict(dtype="bfloat16", num_gpu_blocks=512), 0),
         # three adapters for two slots: evictions too; the third adapter's requests wait for a slot, so fewer
         # sequences run at once and a smaller cache is what reaches preemption
         "lora": ("dense", dict(enable_lora=True, max_loras=2, num_gpu_blocks=300), 3),
         "lora-fp8": ("dense", dict(enable_lora=True, max_loras=2, num_gpu_blocks=300, quantization="fp8"), 3)}
KINDS = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, seed=3),
         SamplingParams(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05),
         SamplingParams(temperature=0.0, repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=0.5),
         SamplingParams(temperature=0.0, logprobs=5), SamplingParams(temperature=1.0, seed=5, n=2, min_tokens=4)]
CONSTRAINTS = [StructuredOutputsParams(json_object=True), StructuredOutputsParams(regex=r"[a-f]{2,8}-\d{2}"),
               StructuredOutputsParams(choice=["yes", "no", "maybe"])]


@pytest.fixture(scope="module")
def gpu_models(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("ready-models")
    shape = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=128,
                 max_position_embeddings=4096, torch_dtype="bfloat16")
    yarn = {**TINY["rope_parameters"], "factor": 128.0}  # 32 original positions stretched to max_model_len
    return {"dense": str(write_tiny_checkpoint(root / "dense", "qwen3", intermediate_size=512, **shape)),
            "moe": str(write_tiny_checkpoint(root / "moe", "qwen3moe", **shape)),
            "gpt-oss": str(write_tiny_gpt_oss(root / "gpt-oss", mxfp4=True, max_position_embeddings=4096,
                                                 rope_parameters=yarn))}


def _adapters(model_dir: str, n: int, root) -> list[LoRARequest]:
    if not n:
        return []
    from tests.engine.lora.adapters import ADAPTERS, write_adapter

    configs = list(ADAPTERS.values())
    return [LoRARequest(f"a{i}", i + 1, write_adapter(model_dir, root / f"a{i}", seed=i, **configs[i % len(configs)]))
            for i in range(n)]


class _Captures:
    """Counts CUDA graph captures begun through torch (every capture railyard makes goes through it)."""

    def __init__(self, monkeypatch) -> None:
        self.count = 0
        begin = torch.cuda.CUDAGraph.capture_begin

        def counted(graph, *args, **kwargs):
            self.count += 1
            return begin(graph, *args, **kwargs)

        monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_begin", counted)


def _params(kind: int, max_tokens: int) -> SamplingParams:
    base = KINDS[kind % len(KINDS)]
    return SamplingParams(**{**base.__dict__, "max_tokens": max_tokens, "ignore_eos": True})


def _workloads(rng: random.Random, max_model_len: int):
    """(prompts, params) batches across the limits, each prompt distinct (no accidental prefix hits)."""
    def prompt(n: int) -> list[int]:
        return [rng.randrange(256) for _ in range(n)]

    for n in (1, 2, 3, 16, 17, 32):  # sequences per batch, mixed lengths and kinds
        yield [prompt(rng.randrange(1, 700)) for _ in range(n)], [_params(i, rng.randrange(4, 48)) for i in range(n)]
    # contexts up to max_model_len: long prompts, decoded to the end
    yield [prompt(max_model_len - 80), prompt(max_model_len // 2 + 3)], [_params(0, 64), _params(1, 64)]
    shared = prompt(1040)  # prefix hits: whole cached blocks, then short and long suffixes
    yield [shared + prompt(n) for n in (1, 9, 16, 300)] * 2, [_params(i, 16) for i in range(8)]
    # structured outputs beside unconstrained rows (the mask applied to some rows, then to every row)
    constrained = [SamplingParams(temperature=0.0, max_tokens=32, structured_outputs=c) for c in CONSTRAINTS]
    yield [prompt(rng.randrange(5, 200)) for _ in range(6)], constrained + [_params(i, 32) for i in range(3)]
    yield [prompt(rng.randrange(5, 50)) for _ in range(3)], constrained


@pytest.mark.parametrize("case", list(CASES))
def test_a_workload_across_the_limits_compiles_and_captures_nothing_after_ready(gpu_models, case, monkeypatch,
                                                                                 tmp_path):
    model, options, num_adapters = CASES[case]
    adapters = _adapters(gpu_models[model], num_adapters, tmp_path / "adapters")
    monkeypatch.setenv("RAILYARD_CACHE", str(tmp_path / "cache"))  # an empty kernel cache: every kernel is new
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    llm = LLM(gpu_models[model], **{**LIMITS, **options})
    captures = _Captures(monkeypatch)
    jit_before = jit_after_ready()
    rng = random.Random(7)
    owners = [*adapters, None]  # each adapter and the base model in turn
    for prompts, params in _workloads(rng, LIMITS["max_model_len"]):
        loras = [owners[i % len(owners)] for i in range(len(prompts))] if adapters else None
        outs = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False, lora_request=loras)
        assert all(o.finished for o in outs)
    stats = llm.engine.stats()
    assert stats.num_preemptions_total > 0  # the workload did reach preemption
    assert stats.prefix_cache_hits > 0
    new = jit_after_ready() - jit_before
    assert new == 0, f"{new} Triton kernels JIT'd after ready, the first: {first_jit_after_ready()[:5]}"
    assert captures.count == 0
    assert stats.jit_after_ready_total == jit_after_ready()


@pytest.mark.parametrize("level", [1, 2])
def test_after_sleep_and_wake_up_the_workload_compiles_and_captures_nothing(gpu_models, level, monkeypatch, tmp_path):
    """Sleep mode's promise: the weights and the KV cache keep their addresses (their physical memory is given back
    and mapped again), so the graphs the start captured stay valid and wake-up captures none; it runs the warm-up's
    peak steps, so the step loop after it meets no first-use work either (the kernels the start compiled stay
    loaded, so wake-up itself compiles or loads none). Greedy tokens are the same before and after."""
    monkeypatch.setenv("RAILYARD_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    llm = LLM(gpu_models["dense"], **LIMITS, enable_sleep_mode=True)
    probe = [[(7 * i + j) % 256 for j in range(40 + 30 * i)] for i in range(4)]
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    before = [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=probe, sampling_params=greedy,
                                                          use_tqdm=False)]
    held = llm.engine.core.device_memory()
    free_awake = torch.cuda.mem_get_info()[0]
    llm.sleep(level)
    memory = llm.engine.core.device_memory()
    assert memory["kv_cache"] == 0 and memory["weights"] <= 0.01 * held["weights"], memory
    given_back = held["kv_cache"] + held["weights"] - memory["weights"]
    assert torch.cuda.mem_get_info()[0] - free_awake >= given_back  # to the device, not to torch's cache
    captures = _Captures(monkeypatch)
    llm.wake_up()
    assert captures.count == 0, "wake-up captured CUDA graphs: the graphs of the start were not kept"
    assert llm.engine.core.last_wake_up.triton_kernels == 0, "wake-up JIT'd kernels: sleep gave back more than memory"
    after = [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=probe, sampling_params=greedy,
                                                         use_tqdm=False)]
    assert after == before
    jit_before = jit_after_ready()
    for prompts, params in _workloads(random.Random(11), LIMITS["max_model_len"]):
        assert all(o.finished for o in llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False))
    new = jit_after_ready() - jit_before
    assert new == 0, f"{new} Triton kernels JIT'd after wake-up, the first: {first_jit_after_ready()[:5]}"
    assert captures.count == 0
