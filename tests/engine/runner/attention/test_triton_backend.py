"""The Triton paged-attention kernels compute what the torch reference backend computes.

Runs on a GPU when there is one, else in Triton's CPU interpreter (skipped where triton is not
installed, as on CI). Covers decode (with context splits), prefill, prefix-cache hits and chunked
prefill (queries that start mid-sequence), GQA and non-power-of-two head dims.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from railyard.engine.runner.attention.torch_backend import TorchAttentionBackend  # noqa: E402
from railyard.engine.runner.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from railyard.engine.runner.kernels.paged_attention import paged_decode  # noqa: E402
from tests.engine.runner.attention.paged_batch import random_batch as _batch  # noqa: E402


def _compare(cached, new, heads=4, kv_heads=2, dim=32, dtype=torch.float32, seed=0):
    q, k, v, cache, meta = _batch(cached, new, heads, kv_heads, dim, dtype, seed)
    ref_cache, got_cache = cache.clone(), cache.clone()
    scale = dim ** -0.5
    ref = TorchAttentionBackend(heads, kv_heads, dim, scale).forward(q, k, v, ref_cache, meta)
    got = TritonAttentionBackend(heads, kv_heads, dim, scale).forward(q, k, v, got_cache, meta)
    assert torch.equal(got_cache, ref_cache), "new K/V must land in exactly the slots the torch backend uses"
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), ref.float(), atol=tol, rtol=tol)


def test_decode_matches_torch_backend():
    _compare(cached=[5, 40, 1, 77], new=[1, 1, 1, 1])


def test_decode_with_gqa_group_of_seven_and_head_dim_16():
    _compare(cached=[12, 33], new=[1, 1], heads=14, kv_heads=2, dim=16)


def test_prefill_of_whole_prompts_matches_torch_backend():
    _compare(cached=[0, 0, 0], new=[3, 70, 17])


def test_prefill_after_prefix_cache_hit_or_earlier_chunk_matches_torch_backend():
    # Queries start mid-sequence: cached blocks (prefix hit / earlier chunk) are read from the cache.
    _compare(cached=[16, 24, 9], new=[5, 40, 1])


def test_mixed_step_with_its_decodes_apart_matches_torch_backend():
    # Two leading decodes take the decode kernel, the rest the prefill kernel: a prompt, a decode behind it,
    # a chunk after a prefix hit.
    _compare(cached=[300, 41, 0, 77, 16], new=[1, 1, 50, 1, 9])


def test_mixed_step_gives_the_same_output_with_its_decodes_apart_or_in_the_prefill_kernel(monkeypatch):
    import railyard.engine.runner.attention.triton_backend as backend

    q, k, v, cache, meta = _batch([120, 9, 0], [1, 1, 33], 4, 2, 32, torch.float32, seed=5)
    split = backend.TritonAttentionBackend(4, 2, 32, 0.2).forward(q, k, v, cache.clone(), meta)
    monkeypatch.setattr(backend, "SPLIT_MIXED_STEPS", False)
    together = backend.TritonAttentionBackend(4, 2, 32, 0.2).forward(q, k, v, cache.clone(), meta)
    torch.testing.assert_close(split, together, atol=1e-5, rtol=1e-5)


def test_split_context_decode_equals_one_split():
    q, k, v, cache, meta = _batch([300, 9, 150], [1, 1, 1], 4, 2, 32, torch.float32, seed=3)
    TritonAttentionBackend(4, 2, 32, 0.2).forward(q, k, v, cache, meta)  # writes the new K/V
    one = paged_decode(q, cache, meta.block_tables, meta.seq_lens, 0.2, num_splits=1)
    many = paged_decode(q, cache, meta.block_tables, meta.seq_lens, 0.2, num_splits=5)
    torch.testing.assert_close(many, one, atol=1e-5, rtol=1e-5)


def test_padded_graph_rows_write_nothing_and_return_zeros():
    q, k, v, cache, meta = _batch([10, 0], [1, 1], 4, 2, 32, torch.float32, seed=4)
    meta.slot_mapping[1] = -1
    meta.seq_lens[1] = 0
    before = cache.clone()
    out = TritonAttentionBackend(4, 2, 32, 0.2).forward(q, k, v, cache, meta)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    changed = (cache != before).flatten(2).any(-1).nonzero().tolist()
    assert all(plane_block[1] == meta.block_tables[0, 1].item() for plane_block in changed)


def test_an_engine_with_prompts_arriving_among_decodes_generates_what_the_torch_backend_does(tmp_path, monkeypatch):
    """Whole engine, float32 tiny model: prompts added while others decode make mixed steps, whose decodes take the
    decode kernel and whose prompts the prefill kernel; greedy tokens equal the torch backend's."""
    import railyard.engine.runner.attention.triton_backend as backend_module
    from railyard.engine.config import EngineConfig, SamplingParams
    from railyard.engine.engine import Engine
    from railyard.engine.startup.tiny_model import write_tiny_checkpoint
    from tests.engine.runner.attention.paged_batch import DEVICE

    path = str(write_tiny_checkpoint(tmp_path / "qwen3", "qwen3"))
    prompts = [[(7 * i + 3 * n) % 256 for i in range(n)] for n in (5, 19, 33, 12)]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    tokens, mixed = {}, {}
    prefill, prompts_apart = backend_module.paged_prefill, []

    def recorded_prefill(q, kv_cache, block_tables, seq_lens, query_start_loc, *args, **kwargs):
        prompts_apart.append(int(query_start_loc[0]) > 0)  # the leading decodes went to the decode kernel
        return prefill(q, kv_cache, block_tables, seq_lens, query_start_loc, *args, **kwargs)

    monkeypatch.setattr(backend_module, "paged_prefill", recorded_prefill)
    for backend in ("torch", "triton"):
        engine = Engine.from_config(EngineConfig(model=path, device=DEVICE, dtype="float32", block_size=8,
                                                 attention_backend=backend, max_model_len=128, num_gpu_blocks=64,
                                                 enforce_eager=True))
        launch, mixed[backend] = engine.executor.launch, 0

        def counted(out, launch=launch, backend=backend):
            lens = [s.num_new_tokens for s in out.scheduled]
            mixed[backend] += lens[0] == 1 and max(lens) > 1  # leading decodes and a prompt in one step
            return launch(out)

        engine.executor.launch = counted
        done: dict[str, list[int]] = {}
        for i, prompt in enumerate(prompts):  # one arrival every third step
            engine.add_request(f"r{i}", None, params, prompt_token_ids=prompt)
            for _ in range(3):
                done.update({o.request_id: o.outputs[0].token_ids for o in engine.step() if o.finished})
        while engine.has_unfinished_requests():
            done.update({o.request_id: o.outputs[0].token_ids for o in engine.step() if o.finished})
        tokens[backend] = [done[f"r{i}"] for i in range(len(prompts))]
        engine.shutdown()
    assert mixed["triton"] >= 3, "the arrivals must join running decodes"
    assert sum(prompts_apart) >= 3 * 2, "each mixed step's prompts, in each of the two layers, apart from its decodes"
    assert tokens["triton"] == tokens["torch"]
