"""The planner's sizing against the engine's own start-up report: weights and KV blocks within 2%.

The engine's report is `ModelRunner.memory` (model/memory.py's MemoryBudget filled with what it measured);
the planner's is `railyard.cluster.sizing.size_kv_cache`, the same formula filled with what the model
description predicts.
"""

from __future__ import annotations

import pytest

from railyard.cluster.sizing import GIB, MIB, SHAPES, size_kv_cache
from railyard.engine.config import EngineConfig
from railyard.engine.engine import Engine
from railyard.model.memory import MemoryBudget
from railyard.model.spec import read_model_spec


@pytest.mark.parametrize(("arch", "block_size", "precision"), [
    ("qwen2", 8, {}), ("qwen3", 16, {}), ("llama", 32, {}),
    # FP8 (the torch reference path on the CPU): 1-byte KV elements, 1-byte linear weights plus float32 scales
    ("qwen2", 16, dict(kv_cache_dtype="fp8")),
    ("qwen3", 8, dict(quantization="fp8", kv_cache_dtype="fp8")),
    ("llama", 16, dict(quantization="fp8", kv_cache_dtype="bfloat16")),
    # Mixture of experts: every expert's weights; FP8 experts with one float32 scale per 128 x 128 block
    ("qwen3moe", 8, {}), ("qwen3moe", 16, dict(quantization="fp8")),
], ids=lambda v: "-".join(f"{k}={x}" for k, x in v.items()) or "model-dtype" if isinstance(v, dict) else str(v))
def test_planner_predicts_the_cpu_engines_weights_and_kv_blocks(tiny_models, arch, block_size, precision):
    # Seats enough that memory, not max_num_seqs * max_model_len, bounds the CPU engine's KV pool.
    engine = Engine(EngineConfig(model=tiny_models[arch], device="cpu", block_size=block_size, max_num_seqs=16384,
                                 max_model_len=1024, enable_prefix_caching=False, **precision))
    runner = engine.executor.runner
    report = runner.memory
    held = sum(t.numel() * t.element_size() for t in runner.kv_caches)  # the KV tensors really allocated
    assert held == runner.num_gpu_blocks * report.block_bytes

    planned = size_kv_cache(
        read_model_spec(tiny_models[arch]), gpu_memory_bytes=report.total_bytes, tensor_parallel_size=1,
        gpu_memory_utilization=report.utilization, block_size=block_size, dtype="float32", max_model_len=1024,
        overhead_bytes_per_gpu=report.activation_bytes + report.other_bytes + report.reserve_bytes, **precision)
    measured_weights = sum(p.numel() * p.element_size() for p in runner.model.parameters())
    assert planned.weights_bytes == pytest.approx(measured_weights, rel=0.02)
    assert planned.bytes_per_block == report.block_bytes
    assert planned.num_blocks == pytest.approx(runner.num_gpu_blocks, rel=0.02)


# The engine's start-up reports on one H200 (143,771 MiB by nvidia.com/gpu.memory; torch sees 139.8 GiB), from
# `bench throughput --max-num-batched-tokens 16384` (docs/lab-notes/2026-gpu-sessions.md, call 6 at commit
# a671580): weights, the 16,384-token step's peak, memory outside torch, and the KV blocks of 16 tokens that were
# left. Those runs predate piecewise CUDA graphs: the planner is asked for an engine without them.
H200_REPORTS = [
    # shape, max_model_len, weights GiB, step GiB, others GiB, blocks
    ("qwen2-7b", 32768, 14.27, 2.20, 0.67, 125_499),
    ("qwen3-0.6b", 40960, 1.15, 0.47, 0.67, 71_444),
]


@pytest.mark.parametrize(("name", "max_model_len", "weights_gib", "step_gib", "others_gib", "blocks"), H200_REPORTS)
def test_planner_predicts_the_h200_engines_start_up_report(name, max_model_len, weights_gib, step_gib, others_gib,
                                                           blocks):
    spec = SHAPES[name]
    planned = size_kv_cache(spec, gpu_memory_bytes=143_771 * MIB, tensor_parallel_size=1, gpu_memory_utilization=0.9,
                            block_size=16, dtype="bfloat16", max_model_len=max_model_len, max_num_seqs=256,
                            max_num_batched_tokens=16384, piecewise_cuda_graphs=False)
    # That report's "weights" were torch's allocated bytes after loading: the parameters and the float32
    # rotary cos/sin tables (which the planner counts with the step's activations).
    rotary_tables = 2 * spec.max_position_embeddings * spec.head_dim * 4
    assert (planned.weights_bytes + rotary_tables) / GIB == pytest.approx(weights_gib, rel=0.02)
    assert planned.num_blocks == pytest.approx(blocks, rel=0.02)
    # Fed the report's own measurements, the shared formula gives back its block count.
    measured = MemoryBudget(int(139.8 * GIB), 0.9, int(weights_gib * GIB), int(step_gib * GIB),
                            int(others_gib * GIB), planned.per_gpu.reserve_bytes, planned.bytes_per_block)
    assert measured.num_blocks == pytest.approx(blocks, rel=0.001)


@pytest.mark.parametrize(("arch", "max_loras", "max_lora_rank"), [("qwen2", 3, 8), ("llama", 2, 40)])
def test_planner_predicts_the_lora_slots_the_engine_allocates(tiny_models, arch, max_loras, max_lora_rank):
    from railyard.model.memory import lora_slot_bytes

    engine = Engine(EngineConfig(model=tiny_models[arch], device="cpu", max_model_len=128, enable_lora=True,
                                 max_loras=max_loras, max_lora_rank=max_lora_rank))
    model = engine.executor.runner.model
    held = sum(buffer.numel() * buffer.element_size() for module in model.modules()
               if getattr(module, "lora", None) is not None
               for name, buffer in module.lora.named_buffers() if name in ("a", "b"))
    spec = read_model_spec(tiny_models[arch]).with_precision("float32", device_type="cpu")
    assert held > 0 and lora_slot_bytes(spec, max_loras, max_lora_rank) == held


def test_a_large_step_on_mxfp4_experts_counts_one_widened_projection():
    """gpt-oss-20b (32 experts, top-4) widens its experts from 4,096 tokens a step (512 slots per expert): the
    planner's step peak then holds the gate/up projection's experts in bf16 (32 x 5,760 x 2,880 x 2 bytes) beside
    the per-token temporaries; smaller steps, and bf16 experts (qwen3-30b-a3b), hold none."""
    from railyard.model.memory import activation_bytes, widened_experts_bytes

    oss, qwen = SHAPES["gpt-oss-20b"], SHAPES["qwen3-30b-a3b"]
    assert widened_experts_bytes(oss, 4096) == 32 * 5760 * 2880 * 2
    assert widened_experts_bytes(oss, 4095) == 0 and widened_experts_bytes(qwen, 16384) == 0
    assert widened_experts_bytes(oss, 4096, tp=2) == 32 * 2880 * 2880 * 2
    step = activation_bytes(oss, 4096, 256)
    assert step - activation_bytes(oss, 4095, 256) > widened_experts_bytes(oss, 4096) * 0.99
