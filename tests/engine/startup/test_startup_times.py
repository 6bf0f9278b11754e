"""An engine times its start-up by phase: every phase it went through is there, none is negative, the weights'
bytes are the checkpoint's, weight loading is split into its parts, the HF tokenizer is not loaded to start (its
EOS id is read from its files), and the report crosses the EngineClient interface in ModelInfo."""

from __future__ import annotations

import threading
from pathlib import Path

import msgspec
import pytest
from safetensors.torch import load_file

from railyard.engine.config import EngineConfig
from railyard.engine.core.engine_core import EngineCore
from railyard.engine.core.model_info import ModelInfo
from railyard.engine.startup.timings import WEIGHT_PARTS, StartupTimes, readable_bytes

CORE_PHASES = {"model_construction", "weight_loading", "kv_profile", "kv_allocation", "cuda_graphs", "executor",
               "tokenizer_eos", "engine_other"}


@pytest.fixture(scope="module")
def core(tiny_model):
    core = EngineCore(EngineConfig(model=tiny_model, device="cpu", max_model_len=128, num_gpu_blocks=64))
    yield core
    core.shutdown()


def test_every_engine_phase_is_timed_and_none_is_negative(core):
    startup = core.model_info().startup
    assert CORE_PHASES <= set(startup.phases)
    assert all(seconds >= 0.0 for seconds in startup.phases.values())
    assert startup.total_s == pytest.approx(sum(startup.phases.values()))


def test_weight_bytes_are_the_checkpoints_and_give_a_rate(core, tiny_model):
    tensors = load_file(str(Path(tiny_model) / "model.safetensors"))
    startup = core.model_info().startup
    assert startup.weight_bytes == sum(t.numel() * t.element_size() for t in tensors.values())
    assert startup.weights_gb_per_s > 0


def test_weight_loading_splits_into_its_parts_which_add_up_to_it(core):
    startup = core.model_info().startup
    assert startup.weights_reader == "mapped"  # the default reader
    assert set(startup.weight_parts) == set(WEIGHT_PARTS) and all(s >= 0.0 for s in startup.weight_parts.values())
    assert sum(startup.weight_parts.values()) == pytest.approx(startup.phases["weight_loading"])
    assert startup.weight_parts["read"] > 0.0


def test_the_core_starts_without_loading_the_hf_tokenizer_yet_has_its_eos_id(tiny_model, monkeypatch):
    """Importing transformers is seconds of Python that took the GIL from the weight load and graph capture: the
    start-up reads the EOS id from the tokenizer's files, and the HF tokenizer is loaded (from railyard's cache or
    by AutoTokenizer) by its first user (an in-process front, or the first constrained request's grammar
    compile)."""
    from transformers import AutoTokenizer

    import railyard.engine.tokenizer as tokenizer_module

    real_load = tokenizer_module.load_tokenizer
    loads: list[str] = []

    def recording_load(*args, **kwargs):
        loads.append(threading.current_thread().name)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(tokenizer_module, "load_tokenizer", recording_load)
    core = EngineCore(EngineConfig(model=tiny_model, device="cpu", max_model_len=128, num_gpu_blocks=64))
    try:
        assert loads == []
        assert AutoTokenizer.from_pretrained(tiny_model).eos_token_id in core.eos_token_ids  # the oracle
        assert core.tokenizer is not None and loads == [threading.current_thread().name]  # its first user
    finally:
        core.shutdown()


def test_the_report_survives_the_engine_process_wire(core):
    info = core.model_info()
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(info), type=ModelInfo)
    assert isinstance(decoded.startup, StartupTimes) and decoded.startup.phases == info.startup.phases
    assert decoded.startup.weight_parts == info.startup.weight_parts
    assert decoded.startup.background == info.startup.background


def test_the_log_line_names_each_phase_and_the_total(core):
    line = core.model_info().startup.describe()
    assert line.startswith("start-up: total ") and all(phase in line for phase in CORE_PHASES)


@pytest.mark.parametrize("n, shown", [(15_231_233_024, "15.23 GB"), (1_190_000_000, "1.19 GB"),
                                      (2_100_000, "2.10 MB"), (4_096, "4.10 kB"), (512, "512 B")])
def test_weight_sizes_show_in_the_unit_that_shows_them(n, shown):
    assert readable_bytes(n) == shown


def test_a_load_beside_the_capture_gives_its_rate_from_its_own_seconds_and_shows_beside_the_phases():
    """Loaded on a thread beside the graphs' capture, the weight_loading phase is only the wait the capture did
    not hide: the rate comes from the load's own seconds, which the report lists beside the phases."""
    from railyard.engine.startup.timings import WeightLoad

    startup = StartupTimes()
    startup.add("cuda_graphs", 1.5)
    startup.add("weight_loading", 0.5)  # the load took 2.0 s, 1.5 of them hidden by the capture
    startup.record_weights(WeightLoad(bytes=16_000_000_000, reader="mapped", read_s=0.1, to_device_s=0.0,
                                      copy_s=1.8), 2.0, beside=True)
    assert startup.weights_gb_per_s == pytest.approx(8.0)
    assert startup.background["weights"] == 2.0
    assert sum(startup.weight_parts.values()) == pytest.approx(2.0)
    assert "weights 2.00 s" in startup.describe()
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(startup), type=StartupTimes)
    assert decoded.background["weights"] == 2.0 and decoded.weights_gb_per_s == pytest.approx(8.0)


def test_steps_that_carry_a_prefill_are_counted_apart_from_pure_decode_steps(tiny_model):
    """Two prompts admitted in one step, then decodes only: one prefill step. A third prompt arriving mid-way
    makes a second (a step with its prefill and the others' decodes)."""
    from railyard.engine.config import SamplingParams

    core = EngineCore(EngineConfig(model=tiny_model, device="cpu", max_model_len=128, num_gpu_blocks=64,
                                   async_scheduling=False))
    try:
        params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
        core.add_request("a", list(range(10, 30)), params)
        core.add_request("b", list(range(40, 52)), params)
        for _ in range(3):
            core.step()
        core.add_request("c", list(range(60, 70)), params)
        while core.has_unfinished_requests():
            core.step()
        stats = core.stats()
        assert stats.prefill_steps_total == 2
        assert stats.num_steps_total > stats.prefill_steps_total
        assert stats.decode_rows_total == 3 * 5  # every output token but each request's first
    finally:
        core.shutdown()


@pytest.mark.parametrize(("kernels", "compiled", "state"), [(0, 0, None), (19, 27, "cold"), (19, 19, "cold"),
                                                            (19, 0, "warm"), (19, 4, "partial")])
def test_the_start_says_how_it_met_its_kernel_cache(kernels, compiled, state):
    """Cold: everything JIT'd was compiled anew (Triton may write more cache entries than kernels); warm: all
    loaded; nothing JIT'd (the CPU): no word on it."""
    times = StartupTimes(triton_kernels=kernels, triton_compiled=compiled, triton_cache_dir="/c")
    times.add("imports", 1.0)
    assert times.kernel_cache == state and times.as_dict()["kernel_cache"] == state
    line = times.describe()
    assert line.startswith(f"start-up ({state} kernel cache): total 1.00 s" if state else "start-up: total 1.00 s")


@pytest.mark.parametrize(("kernels", "bytecode", "head"), [
    (19, "cold", "start-up (warm kernel cache, cold Python bytecode):"),
    (0, "warm", "start-up (warm Python bytecode):"),
    (19, None, "start-up (warm kernel cache):")])
def test_the_start_says_how_it_met_railyards_python_bytecode(kernels, bytecode, head):
    """Where railyard keeps the bytecode (an installation without its own), a start that compiled torch's sources
    says so beside the kernel cache: both make a start cold."""
    times = StartupTimes(triton_kernels=kernels, triton_compiled=0, bytecode_cache=bytecode)
    times.add("imports", 1.0)
    assert times.describe().startswith(head) and times.as_dict()["bytecode_cache"] == bytecode
