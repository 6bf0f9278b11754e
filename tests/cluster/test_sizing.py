"""KV-cache sizing from a model's shape and replica counts from a measured engine profile."""

from __future__ import annotations

import json

import pytest

from railyard.cluster.placement import RayNode, place_replicas
from railyard.cluster.sizing import (
    GIB,
    SHAPES,
    EngineProfile,
    load_profile,
    replicas_for_rate,
    resolve_shape,
    size_kv_cache,
)
from railyard.cluster.workload import Replica
from railyard.errors import ConfigError
from railyard.shapes import shape_config


@pytest.mark.parametrize(
    ("name", "published"),
    # Parameter counts on the models' Hugging Face cards / safetensors metadata.
    # Qwen3-30B-A3B's counts every expert (HF transformers' model built from the same config agrees).
    [("llama3-8b", 8_030_261_248), ("qwen2-7b", 7_615_616_512), ("qwen3-0.6b", 596_049_920),
     ("qwen3-30b-a3b", 30_532_122_624)],
)
def test_named_shapes_reproduce_the_published_parameter_counts(name, published):
    assert SHAPES[name].num_params() == published


@pytest.mark.parametrize(
    ("name", "layers", "kv_heads", "head_dim"),
    [("qwen2-7b", 28, 4, 128), ("llama3-8b", 32, 8, 128), ("qwen3-0.6b", 28, 8, 128), ("qwen3-30b-a3b", 48, 4, 128)],
)
def test_bytes_per_block_is_two_times_layers_kv_heads_head_dim_block_dtype(name, layers, kv_heads, head_dim):
    block_size, dtype_bytes = 16, 2  # the named shapes are bfloat16
    expected = 2 * layers * kv_heads * head_dim * block_size * dtype_bytes
    assert SHAPES[name].kv_bytes_per_block(block_size) == expected


def test_kv_cache_is_what_memory_times_utilization_leaves_after_weights_and_overhead():
    shape = SHAPES["llama3-8b"]
    sizing = size_kv_cache(
        shape,
        gpu_memory_bytes=80 * GIB,
        tensor_parallel_size=1,
        gpu_memory_utilization=0.9,
        block_size=16,
        dtype="bfloat16",
        max_model_len=8192,
        overhead_bytes_per_gpu=2 * GIB,
    )
    kv = int(80 * GIB * 0.9) - 8_030_261_248 * 2 - 2 * GIB
    per_block = 2 * 32 * 8 * 128 * 16 * 2
    assert sizing.kv_cache_bytes == kv
    assert sizing.num_blocks == kv // per_block
    assert sizing.tokens == sizing.num_blocks * 16
    assert sizing.max_seqs_at_max_len == sizing.num_blocks // (8192 // 16)


def test_tensor_parallelism_pools_the_memory_of_every_gpu_in_the_replica():
    args = dict(
        gpu_memory_bytes=24 * GIB, gpu_memory_utilization=0.9, block_size=16, dtype="bfloat16", max_model_len=4096
    )
    one = size_kv_cache(SHAPES["llama3-8b"], tensor_parallel_size=1, **args)
    two = size_kv_cache(SHAPES["llama3-8b"], tensor_parallel_size=2, **args)
    assert two.num_blocks > 2 * one.num_blocks  # the weights are paid once, the memory twice


def test_a_model_too_big_for_the_gpu_gets_no_kv_cache():
    sizing = size_kv_cache(
        SHAPES["qwen2-7b"],
        gpu_memory_bytes=16 * GIB,
        tensor_parallel_size=1,
        gpu_memory_utilization=0.9,
        block_size=16,
        dtype="bfloat16",
        max_model_len=8192,
    )
    assert sizing.num_blocks == 0


def test_a_mixture_of_experts_pays_for_every_expert_on_the_gpu():
    # Qwen3-30B-A3B multiplies by 3B parameters per token but holds all 30.5B: one H200 (141 GB) carries it with
    # room for KV; an L40S (45 GB) cannot hold the weights at all.
    spec = SHAPES["qwen3-30b-a3b"]
    args = dict(tensor_parallel_size=1, gpu_memory_utilization=0.9, block_size=16, dtype="bfloat16",
                max_model_len=32768)
    h200 = size_kv_cache(spec, gpu_memory_bytes=143771 * 2**20, **args)
    assert h200.weights_bytes == 2 * 30_532_122_624
    assert h200.max_seqs_at_max_len >= 8
    assert spec.active_linear_params < spec.num_params() / 9
    assert size_kv_cache(spec, gpu_memory_bytes=46068 * 2**20, **args).num_blocks == 0


def test_a_checkpoint_config_json_wins_over_named_shapes(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(shape_config("qwen3-0.6b")))
    shape, source = resolve_shape("llama3-8b", str(tmp_path))
    assert shape == SHAPES["qwen3-0.6b"]
    assert source.endswith("config.json")


def test_an_unknown_named_shape_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown model shape 'gpt-5'"):
        resolve_shape("m", "/nonexistent", "gpt-5")


def test_replicas_for_rate_keep_each_replica_under_80_percent_of_its_measured_rate():
    profile = EngineProfile(requests_per_s=5.0, output_tokens_per_s=None, source="x")
    assert replicas_for_rate(18, profile) == 5  # 18 / (5 * 0.8) = 4.5
    assert replicas_for_rate(4, profile) == 1
    assert replicas_for_rate(8, profile) == 2  # exactly at 80%


@pytest.mark.parametrize("field", ["requests_per_s", "request_throughput"])
def test_bench_json_rate_is_read_from_railyard_or_vllm_field_names(tmp_path, field):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({field: 12.5, "output_tokens_per_s": 3000.0, "num_prompts": 200, "elapsed_s": 16.0}))
    profile = load_profile(path)
    assert profile.requests_per_s == 12.5
    assert profile.output_tokens_per_s == 3000.0


def test_bench_json_without_a_request_rate_is_a_config_error(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"elapsed_s": 3.0}))
    with pytest.raises(ConfigError, match="requests_per_s or request_throughput"):
        load_profile(path)


def test_strict_pack_group_needs_all_its_gpus_on_one_ray_node():
    # Two worker pods with 4 free GPUs each: 8 GPUs in total, but STRICT_PACK of 8 fits on neither.
    nodes = [RayNode("w0", "g", "n0", 4, 32), RayNode("w1", "g", "n1", 4, 32)]
    (placed,) = place_replicas([Replica("g", 0, 8, 8, True)], nodes, head_running=True)
    assert placed.node is None
    assert "placement group STRICT_PACK 8 x {GPU: 1, CPU: 1} fits no Ray node" in placed.message
    assert "the most free on any running worker pod is 4" in placed.message


def test_replicas_fill_their_own_worker_group_first():
    nodes = [RayNode("other", "a", "n0", 2, 8), RayNode("mine", "b", "n1", 2, 8)]
    (placed,) = place_replicas([Replica("b", 0, 2, 2, True)], nodes, head_running=True)
    assert placed.pod == "mine"


def test_a_replica_short_of_cpus_says_so_rather_than_blaming_gpus():
    nodes = [RayNode("w0", "g", "n0", 2, 1)]
    (placed,) = place_replicas([Replica("g", 0, 2, 2, True)], nodes, head_running=True)
    assert placed.message.endswith("fits no Ray node: needs 2 CPU(s) beside its GPUs, the most free is 1")


def test_single_gpu_replicas_reserve_the_piecewise_cuda_graphs_memory():
    from railyard.model.memory import piecewise_graph_bytes

    def blocks(**kw):
        return size_kv_cache(SHAPES["qwen2-7b"], gpu_memory_bytes=140 * GIB, gpu_memory_utilization=0.9,
                             block_size=16, dtype="bfloat16", max_model_len=4096, max_num_batched_tokens=8192, **kw)

    on, off = blocks(tensor_parallel_size=1), blocks(tensor_parallel_size=1, piecewise_cuda_graphs=False)
    # The engine captures them up to 2,048 tokens: their buffers and pool leave that much less for KV blocks.
    assert on.kv_cache_bytes == off.kv_cache_bytes - piecewise_graph_bytes(SHAPES["qwen2-7b"], 2048)
    assert blocks(tensor_parallel_size=1, enforce_eager=True).overhead_bytes < off.overhead_bytes
    # Tensor-parallel replicas run eagerly apart from their decode graphs: nothing to reserve.
    tp_on, tp_off = blocks(tensor_parallel_size=2), blocks(tensor_parallel_size=2, piecewise_cuda_graphs=False)
    assert tp_on.num_blocks == tp_off.num_blocks


def test_the_planner_sizes_the_kv_cache_without_graph_memory_when_the_stack_turns_graphs_off():
    from railyard.cluster.plan import size_deployments
    from railyard.stack import parse_stack

    def kv_bytes(engine: dict) -> int:
        stack = parse_stack({"name": "s", "image": "ghcr.io/example/railyard:0.1.0", "gpu_product": "NVIDIA-H200",
                             "models": [{"name": "qwen2-7b", "model": "/m", "shape": "qwen2-7b", "engine": engine}]})
        (sizing,) = size_deployments(stack, [], None, None)  # GPU memory from the stack's gpu_product
        return sizing.kv.kv_cache_bytes

    default = kv_bytes({})
    assert kv_bytes({"piecewise_cuda_graphs": False}) > default
    assert kv_bytes({"enforce_eager": True}) > kv_bytes({"piecewise_cuda_graphs": False})


def test_lora_slots_take_max_loras_times_rank_times_every_projections_in_plus_out_dims():
    # vLLM's LoRA memory for qwen2-7b (hidden 3584, intermediate 18944, 28 q heads and 4 KV heads of 128, 28
    # layers, bfloat16): each slot holds A [r, in] and B [out, r] of q, k, v, o, gate, up and down in every layer.
    in_plus_out = (3584 + 3584) + 2 * (3584 + 512) + (3584 + 3584) + 2 * (3584 + 18944) + (18944 + 3584)
    expected = 8 * 16 * in_plus_out * 28 * 2

    def sizing(**lora):
        return size_kv_cache(SHAPES["qwen2-7b"], gpu_memory_bytes=140 * GIB, tensor_parallel_size=1,
                             gpu_memory_utilization=0.9, block_size=16, dtype="bfloat16", max_model_len=4096, **lora)

    base, with_loras = sizing(), sizing(max_loras=8, max_lora_rank=16)
    assert with_loras.per_gpu.lora_bytes == expected
    assert with_loras.kv_cache_bytes == base.kv_cache_bytes - expected
    assert with_loras.overhead_bytes == base.overhead_bytes + expected


def test_lora_slots_are_padded_to_the_kernels_rank_tile():
    # The batched-LoRA kernels run ranks in power-of-two tiles of at least 16: rank 8 costs what 16 does, 24 what 32.
    def lora_bytes(rank: int) -> int:
        return size_kv_cache(SHAPES["qwen3-0.6b"], gpu_memory_bytes=80 * GIB, tensor_parallel_size=1,
                             gpu_memory_utilization=0.9, block_size=16, dtype="bfloat16", max_model_len=4096,
                             max_loras=4, max_lora_rank=rank).per_gpu.lora_bytes

    assert lora_bytes(8) == lora_bytes(16)
    assert lora_bytes(24) == lora_bytes(32) == 2 * lora_bytes(16)
    assert lora_bytes(64) == 4 * lora_bytes(16)


def test_tensor_parallel_ranks_hold_the_shards_of_the_lora_slots_their_layers_hold():
    # Column-parallel q/k/v/gate/up split B's rows, row-parallel o/down split A's columns; the whole A or B of the
    # other side stays on every rank (as their weights' inputs and outputs do).
    spec = SHAPES["llama3-8b"]  # hidden 4096, intermediate 14336, 32 q heads and 8 KV heads of 128, 32 layers
    per_rank = (4096 + 4096 // 2) + 2 * (4096 + 1024 // 2) + (4096 // 2 + 4096) + 2 * (4096 + 14336 // 2) \
        + (14336 // 2 + 4096)
    tp2 = size_kv_cache(spec, gpu_memory_bytes=80 * GIB, tensor_parallel_size=2, gpu_memory_utilization=0.9,
                        block_size=16, dtype="bfloat16", max_model_len=4096, max_loras=2, max_lora_rank=32)
    assert tp2.per_gpu.lora_bytes == 2 * 32 * per_rank * 32 * 2


def test_a_profile_of_the_same_model_on_the_same_gpu_matches_whatever_the_names_punctuation():
    spec = SHAPES["qwen2-7b"]
    dims = {k: getattr(spec, k) for k in ("architecture", "vocab_size", "hidden_size", "num_layers", "num_heads")}
    same = EngineProfile(5.0, None, "x", device="NVIDIA H200", model={"name": "/models/qwen2-7b", **dims})
    assert same.mismatch(spec, "NVIDIA-H200") is None
    assert "another device (NVIDIA H200, not NVIDIA-L40S)" in same.mismatch(spec, "NVIDIA-L40S")


def test_the_planner_counts_the_host_memory_a_standby_engines_weights_keep_and_checks_the_pod_holds_it():
    from railyard.cluster.plan import size_deployments
    from railyard.stack import parse_stack

    def sizing(memory: str, **auto):
        stack = parse_stack({"name": "s", "image": "ghcr.io/example/railyard:0.1.0", "gpu_product": "NVIDIA-H200",
                             "models": [{"name": "qwen2-7b", "model": "/m", "shape": "qwen2-7b", "gpu_fraction": 0.5,
                                         "engine": {"num_gpu_blocks": 4096}, "resources": {"memory": memory},
                                         "autoscaling": {"min_replicas": 1, "max_replicas": 2, **auto}}]})
        (entry,) = size_deployments(stack, [], None, None)
        return entry

    fits = sizing("64Gi")  # half-GPU replicas that scale up: one standby by default, its weights asleep
    assert fits.standby_host_bytes == fits.kv.weights_bytes
    assert "1 standby engine(s) asleep per GPU keep" in fits.note and "more than the pod's memory" not in fits.note
    assert "more than the pod's memory (8Gi)" in sizing("8Gi").note
    off = sizing("8Gi", standby_engines=0)
    assert off.standby_host_bytes == 0 and "standby" not in off.note


def _gpt_oss_120b_on_an_h100(engine: dict):
    from railyard.cluster.plan import size_deployments
    from railyard.stack import parse_stack

    stack = parse_stack({"name": "s", "image": "ghcr.io/example/railyard:0.1.0", "gpu_product": "NVIDIA-H100-80GB-HBM3",
                         "models": [{"name": "gpt-oss-120b", "model": "/m", "shape": "gpt-oss-120b",
                                     "engine": engine}]})
    (sizing,) = size_deployments(stack, [], None, None)
    return sizing


def test_the_planner_refuses_what_the_engine_would_with_its_sliding_layers_blocks_and_names_what_fits():
    """As the engine checks at start-up: a sequence of max_model_len prefilled in chunks holds its full layers'
    blocks and its sliding layers' chunk-plus-window, so a cache with more tokens than max_model_len can still be
    too small; the note names the max_model_len the cache holds."""
    from railyard.model.kv_fit import blocks_to_hold, longest_context

    short = _gpt_oss_120b_on_an_h100({"max_model_len": 131072, "max_num_batched_tokens": 16384})
    assert "the engine would refuse to start: the KV cache holds" in short.note and "sliding-window" in short.note
    fits = longest_context(short.kv.num_blocks, 16384, 16, 128)
    assert f"max_model_len {fits} fits" in short.note
    assert "refuse" not in _gpt_oss_120b_on_an_h100({"max_model_len": fits, "max_num_batched_tokens": 16384}).note
    # The tokens alone are not the rule: at a length the cache's tokens exceed, the sliding blocks can still not fit.
    length = short.kv.tokens - 16
    assert blocks_to_hold(length, 16384, 16, 128) > short.kv.num_blocks
    over = _gpt_oss_120b_on_an_h100({"max_model_len": length, "max_num_batched_tokens": 16384})
    assert over.kv.num_blocks == short.kv.num_blocks and "the engine would refuse to start" in over.note
