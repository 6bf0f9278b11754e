"""gpt-oss in the model description: the named shapes have the published sizes (20.9B / 3.6B active, 116.8B / 5.1B
active, ~13 GB and ~65 GB with MXFP4 experts), sliding-window layers halve a KV block and cap what a decode reads,
and what railyard cannot run is refused with the reason."""

from __future__ import annotations

import pytest

from railyard.bench.roofline import offline_roofline
from railyard.cluster.sizing import size_kv_cache
from railyard.errors import ConfigError, ModelLoadError
from railyard.model.spec import ModelSpec, check_tensor_parallel, expert_shard
from railyard.shapes import shape_config

GB = 1e9


def _spec(name: str, **overrides) -> ModelSpec:
    return ModelSpec.from_hf_config({**shape_config(name), **overrides})


@pytest.mark.parametrize("name, total, active, weights_gb", [("gpt-oss-20b", 20.9, 3.6, 13.8),
                                                             ("gpt-oss-120b", 116.8, 5.1, 65.3)])
def test_named_shapes_have_the_published_parameters_and_mxfp4_sizes(name, total, active, weights_gb):
    spec = _spec(name)
    assert spec.num_params() / GB == pytest.approx(total, abs=0.05)
    assert spec.matmul_params / GB == pytest.approx(active, abs=0.05)  # top-4 experts, attention, LM head
    assert spec.weight_bytes() / GB == pytest.approx(weights_gb, abs=0.1)
    assert spec.expert_quantization == "mxfp4" and spec.quantization is None


def test_sliding_layers_share_cache_tensors_with_full_ones_so_a_block_is_half_the_layers():
    spec = _spec("gpt-oss-20b")
    assert spec.sliding_layers == tuple(range(0, 24, 2)) and spec.sliding_window == 128
    assert spec.num_kv_tensors == 12
    assert spec.kv_bytes_per_block(16) == 2 * 12 * 8 * 64 * 2 * 16
    assert [spec.kv_tensor_of(i) for i in range(4)] == [0, 0, 1, 1]
    # A 4096-token sequence: 256 full blocks and the window's 9 (8 behind the next token, its own).
    assert spec.kv_blocks_per_sequence(4096, 16) == 256 + 9


def test_a_decode_reads_the_whole_context_in_full_layers_and_the_window_in_sliding_ones():
    spec = _spec("gpt-oss-20b")
    per_layer_token = 2 * 8 * 64 * 2
    assert spec.kv_bytes_read(4096) == per_layer_token * (12 * 4096 + 12 * 128)
    assert spec.kv_bytes_read(100) == per_layer_token * 24 * 100
    assert spec.decode_attention_flops(4096) == 4.0 * 64 * 64 * (12 * 4096 + 12 * 128)
    # a prompt: causal keys in full layers; in sliding layers a query sees at most the window
    n, w = 1000, 128
    assert spec.prefill_attention_flops(n) == 4.0 * 64 * 64 * (12 * n * (n + 1) / 2 + 12 * (w * (w + 1) / 2 + (n - w) * w))


def test_roofline_counts_the_window_not_the_whole_context_for_sliding_layers():
    spec = _spec("gpt-oss-20b")
    dense_attention = ModelSpec.from_hf_config({**shape_config("gpt-oss-20b"), "layer_types": ["full_attention"] * 24})
    long = offline_roofline(spec, [4000] * 64, [256] * 64)
    full = offline_roofline(dense_attention, [4000] * 64, [256] * 64)
    assert long.decode_s < full.decode_s and long.prefill_s < full.prefill_s


def test_the_planner_fits_more_long_sequences_with_sliding_blocks():
    spec = _spec("gpt-oss-20b")
    dense_attention = ModelSpec.from_hf_config({**shape_config("gpt-oss-20b"), "layer_types": ["full_attention"] * 24})
    args = dict(gpu_memory_bytes=141 * 2**30, tensor_parallel_size=1, gpu_memory_utilization=0.9, block_size=16,
                dtype="bfloat16", max_model_len=32768)
    sliding, full = size_kv_cache(spec, **args), size_kv_cache(dense_attention, **args)
    assert sliding.bytes_per_block * 2 == full.bytes_per_block
    assert sliding.max_seqs_at_max_len >= 1.9 * full.max_seqs_at_max_len


@pytest.mark.parametrize("tp, slices", [(2, [(0, 1440)] * 2), (4, [(0, 736)] * 3 + [(0, 672)]),
                                        (8, [(0, 384)] * 7 + [(0, 192)])])
def test_mxfp4_experts_split_over_ranks_in_whole_32_weight_groups_the_last_rank_padded(tp, slices):
    """2880 is 90 groups of 32: over 4 ranks 23, 23, 23 and 21 of them (720 a rank would split a group's exponent),
    each rank holding 23 groups' width, as vLLM splits gpt-oss."""
    spec = _spec("gpt-oss-20b")
    check_tensor_parallel(spec, tp)
    shards = [expert_shard(2880, tp, rank, 32) for rank in range(tp)]
    assert [(s.start - rank * s.held, s.real) for rank, s in enumerate(shards)] == slices
    assert sum(s.real for s in shards) == 2880
    assert spec.expert_intermediate(tp) == shards[0].held
    # what one rank holds: every expert at the padded width
    assert spec.weight_bytes(tp) > spec.weight_bytes() / tp


def test_unquantized_experts_still_split_only_evenly():
    with pytest.raises(ConfigError, match="expert intermediate size 2884"):
        check_tensor_parallel(_spec("gpt-oss-20b", quantization_config=None, intermediate_size=2884), 8)


def test_layer_types_must_name_each_layers_attention():
    with pytest.raises(ModelLoadError, match="'layer_types' must list 24 of sliding_attention, full_attention"):
        _spec("gpt-oss-20b", layer_types=["sliding_attention"] * 23)


def test_mxfp4_is_refused_for_other_architectures():
    cfg = {**shape_config("qwen3-30b-a3b"), "quantization_config": {"quant_method": "mxfp4"}}
    with pytest.raises(ModelLoadError, match="mxfp4 is supported for gpt-oss"):
        ModelSpec.from_hf_config(cfg)


def test_a_decode_step_reads_its_experts_at_4_25_bits_a_weight():
    """The roofline's bytes: the same shape with bf16 experts reads 2 bytes where MXFP4 reads 17/32 (half a byte and
    a 32nd of an exponent byte), for the experts a one-token step hits (4 in each of 24 layers)."""
    mxfp4, bf16 = _spec("gpt-oss-20b"), _spec("gpt-oss-20b", quantization_config=None)
    experts = 24 * 4 * mxfp4.expert_params()
    assert bf16.step_weight_bytes(1) - mxfp4.step_weight_bytes(1) == pytest.approx(experts * (2 - 17 / 32))
