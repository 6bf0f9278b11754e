"""`--quantization fp8` and `--kv-cache-dtype fp8` through the engine: block counts, swap, prefix caching,
flags and errors. (Accuracy: tests/bench/test_fp8_accuracy.py; kernels: tests/engine/runner/attention.)

Oracles: the same engine on the same FP8 cache without memory pressure or without prefix caching
(swapping and reusing blocks must change no token), and the cache's element size.
"""

from __future__ import annotations

import pytest

from railyard.cli import main
from railyard.engine.runner import model_runner
from railyard.engine.config import EngineConfig, SamplingParams
from railyard.engine.llm import LLM
from railyard.errors import ConfigError

GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
PROMPTS = [[(7 * i + 3 * n) % 256 for i in range(n)] for n in (3, 9, 17, 33, 40)]


def _generate(llm: LLM, prompts=PROMPTS) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=GREEDY,
                                                         use_tqdm=False)]


def test_fp8_kv_cache_holds_twice_the_blocks_of_bf16_and_four_times_float32(tiny_model, monkeypatch):
    # The CPU pool is a fixed budget, so the count follows the bytes per block as the GPU's profile does.
    monkeypatch.setattr(model_runner, "CPU_KV_CACHE_GIB", 1 / 64)
    blocks = {kv: LLM(tiny_model, device="cpu", kv_cache_dtype=kv).engine.stats().num_total_blocks
              for kv in ("auto", "bfloat16", "fp8")}  # auto: the float32 model's dtype
    assert blocks["fp8"] == 2 * blocks["bfloat16"] == 4 * blocks["auto"]
    # 16 tokens x 2 KV heads x 16 dims x K and V x 2 layers at 1 byte each: 2 KiB; the budget holds 8192
    assert blocks["fp8"] == 2**30 // 64 // (16 * 2 * 16 * 2 * 2)


def test_fp8_weights_and_cache_report_their_dtypes(tiny_model):
    runner = LLM(tiny_model, device="cpu", quantization="fp8", kv_cache_dtype="fp8").engine.executor.runner
    assert runner.quantization == "fp8" and str(runner.kv_dtype) == "torch.float8_e4m3fn"
    assert all(c.element_size() == 1 for c in runner.kv_caches)
    qkv = runner.model.model.layers[0].self_attn.qkv_proj
    assert str(qkv.weight.dtype) == "torch.float8_e4m3fn" and qkv.weight_scale.shape == (qkv.weight.shape[0],)
    assert runner.model.lm_head.weight.dtype == runner.model.model.embed_tokens.weight.dtype == runner.dtype


def test_swap_preemption_over_an_fp8_cache_changes_no_token(tiny_model):
    fp8 = dict(device="cpu", block_size=8, max_model_len=64, quantization="fp8", kv_cache_dtype="fp8")
    roomy = _generate(LLM(tiny_model, num_gpu_blocks=200, **fp8))
    tight = LLM(tiny_model, num_gpu_blocks=14, preemption_mode="swap", num_cpu_blocks=64, **fp8)
    assert _generate(tight) == roomy
    assert tight.engine.stats().num_preemptions_total > 0


def test_prefix_cache_hits_over_an_fp8_cache_change_no_token(tiny_model):
    shared = [(5 * i) % 256 for i in range(48)]  # three full blocks of 16 shared by every prompt
    prompts = [shared + [(11 * i + n) % 256 for i in range(n)] for n in (4, 9, 20)]
    fp8 = dict(device="cpu", kv_cache_dtype="fp8")
    cold = _generate(LLM(tiny_model, enable_prefix_caching=False, **fp8), prompts)
    llm = LLM(tiny_model, **fp8)
    first = _generate(llm, prompts[:1])
    rest = _generate(llm, prompts[1:])  # these reuse the first prompt's cached FP8 blocks
    stats = llm.engine.stats()
    assert stats.prefix_cache_hits > 0
    assert first + rest == cold


def test_flags_reach_the_engine_config():
    import argparse

    from railyard.engine.args import add_engine_args, engine_config_from_args

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    config = engine_config_from_args(parser.parse_args(["--model", "m", "--quantization", "fp8",
                                                        "--kv-cache-dtype", "fp8", "--fp8-gemm", "rowwise-fast"]))
    assert (config.quantization, config.kv_cache_dtype, config.fp8_gemm) == ("fp8", "fp8", "rowwise-fast")


@pytest.mark.parametrize("field, value, message", [
    ("quantization", "int4", "quantization must be fp8 (or unset), got 'int4'"),
    ("kv_cache_dtype", "fp8_e5m2", "kv_cache_dtype must be one of auto, bfloat16, fp8; got 'fp8_e5m2'"),
    ("fp8_gemm", "cutlass", "fp8_gemm must be one of auto, rowwise, rowwise-fast, cublaslt, cublaslt-fast, triton; got 'cutlass'"),
])
def test_unknown_values_are_config_errors(field, value, message):
    with pytest.raises(ConfigError) as err:
        EngineConfig(model="m", **{field: value})
    assert str(err.value) == message


def test_a_bad_kv_cache_dtype_on_the_command_line_exits_2_with_one_line(tiny_model, capsys):
    rc = main(["generate", "--model", tiny_model, "--prompt", "x", "--kv-cache-dtype", "int8"])
    assert rc == 2
    assert capsys.readouterr().err.strip() == \
        "railyard generate: error: kv_cache_dtype must be one of auto, bfloat16, fp8; got 'int8'"


def test_generate_command_runs_fp8_weights_and_cache(tiny_model, capsys):
    rc = main(["generate", "--model", tiny_model, "--prompt", "hello", "--max-tokens", "4", "--ignore-eos",
               "--quantization", "fp8", "--kv-cache-dtype", "fp8", "--json"])
    assert rc == 0
    assert '"finish_reason": "length"' in capsys.readouterr().out


def test_an_fp8_cache_on_a_gpu_without_fp8_conversions_needs_the_torch_backend(monkeypatch):
    """Triton converts e4m3 in registers only on compute capability 8.9+: an explicit triton backend on an
    older GPU is refused; the automatic choice takes the torch backend, which runs the cache anywhere."""
    import torch

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    gpu = torch.device("cuda")
    with pytest.raises(ConfigError, match="needs a GPU of compute capability 8.9 or newer .* this one is 8.0: "
                                          "use --attention-backend torch"):
        model_runner._fp8_attention_backend("triton", gpu)
    assert model_runner._fp8_attention_backend("auto", gpu) == "torch"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert model_runner._fp8_attention_backend("triton", gpu) == "triton"
    assert model_runner._fp8_attention_backend("auto", torch.device("cpu")) == "auto"


def test_a_named_fp8_gemm_without_fp8_tensor_cores_is_refused_and_auto_runs_the_reference(tiny_model):
    """The CPU (and pre-Ada GPUs, and float32 models) have no tensor-core GEMM to pick: asking for one is an error
    that says what runs instead, not a silent fallback; auto runs the dequantizing reference."""
    with pytest.raises(ConfigError, match="fp8_gemm 'cublaslt' needs FP8 tensor cores .* reference: dequantize "
                                          "then matmul"):
        LLM(tiny_model, device="cpu", quantization="fp8", fp8_gemm="cublaslt")
    runner = LLM(tiny_model, device="cpu", quantization="fp8").engine.executor.runner
    assert {m.fp8_gemm for m in runner.model.modules() if getattr(m, "quant", None) == "fp8"} == {"auto"}


def test_with_fp8_weights_the_norms_before_qkv_and_gate_up_quantize_for_them_and_no_other_norm_does(tiny_model):
    """kernels/fused.py's rms_norm_quant runs only where an FP8 linear layer is the norm's one reader: not before
    the LM head (the final norm), not for q/k norms, not without FP8 weights."""
    model = LLM(tiny_model, device="cpu", quantization="fp8").engine.executor.runner.model
    quantizing = {name for name, m in model.named_modules() if getattr(m, "quantize_output", False)}
    assert quantizing == {f"model.layers.{i}.{norm}" for i in range(len(model.model.layers))
                          for norm in ("input_layernorm", "post_attention_layernorm")}
    plain = LLM(tiny_model, device="cpu").engine.executor.runner.model
    assert not any(getattr(m, "quantize_output", False) for m in plain.modules())


def test_a_named_fp8_gemm_without_fp8_weights_is_refused(tiny_model):
    with pytest.raises(ConfigError, match="fp8_gemm 'rowwise' picks the GEMM of FP8 weights: this model has none"):
        LLM(tiny_model, device="cpu", fp8_gemm="rowwise")
