"""Triton JIT after ready is counted (and named), start-up JIT is not, and hooks held before keep working: the
watch is what the GPU test of a ready engine reads, and what /metrics reports as railyard:triton_jit_after_ready.

Oracle: Triton's own cache hook, called as Triton calls it (keyword arguments, before a compile or load)."""

from __future__ import annotations

import threading

import pytest

from railyard.engine.startup import jit_watch
from railyard.engine.startup.jit_watch import as_start_up, jit_after_ready, starting, watch_after_ready
from railyard.engine.startup.timings import TritonJitTimer

knobs = pytest.importorskip("triton").knobs


@pytest.fixture
def clean_hooks():
    saved = knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook
    yield
    knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook = saved


def _triton_jit(name: str = "kernel"):
    """What Triton does before it compiles or loads a kernel."""
    return knobs.runtime.jit_cache_hook(key="k", repr=name, fn=None, compile={}, is_manual_warmup=False,
                                        already_compiled=False)


def test_a_kernel_jitted_after_ready_is_counted_and_named(clean_hooks):
    assert watch_after_ready()
    before = jit_after_ready()
    _triton_jit("_prefill_kernel[BLOCK_M=16]")
    assert jit_after_ready() == before + 1
    assert "_prefill_kernel[BLOCK_M=16]" in jit_watch.first_jit_after_ready() or before >= jit_watch.KEEP


def test_a_kernel_is_named_with_each_arguments_specialisation_and_its_constexprs():
    """As Triton 3.6 calls the hook: the signature by parameter, constexpr values and attributes by argument path
    (here the pointer specialised as 16-byte aligned, the integer not)."""
    described = jit_watch.describe(dict(
        repr="_prefill_kernel[num_warps=4, num_stages=2](q_ptr: (", signature={"q_ptr": "*bf16", "n": "i32",
                                                                             "BLOCK": "constexpr"},
        constants={(2,): 64}, configs=[{(0,): [["tt.divisibility", 16]]}]))
    assert described == "_prefill_kernel[num_warps=4, num_stages=2](q_ptr: *bf16/16, n: i32) constexprs {'BLOCK': 64}"


def test_start_up_jit_is_not_counted_on_its_thread_nor_in_start_up_work_on_another(clean_hooks):
    watch_after_ready()
    before = jit_after_ready()
    with starting():
        _triton_jit()
        with starting():  # nested (the runner inside an engine's start-up)
            _triton_jit()
    worker = threading.Thread(target=as_start_up(_triton_jit))
    worker.start()
    worker.join()
    assert jit_after_ready() == before
    _triton_jit()
    assert jit_after_ready() == before + 1


def test_a_hook_held_before_still_runs_and_its_answer_stands(clean_hooks):
    seen = []
    knobs.runtime.jit_cache_hook = lambda **kw: seen.append(kw["repr"]) or True  # True: Triton skips the compile
    jit_watch._installed = False  # this process's watch, installed afresh over the held hook
    watch_after_ready()
    assert _triton_jit("held") is True and seen == ["held"]


def test_the_watch_comes_back_after_someone_cleared_the_hooks(clean_hooks):
    watch_after_ready()
    knobs.runtime.jit_cache_hook = None
    watch_after_ready()
    before = jit_after_ready()
    _triton_jit()
    assert jit_after_ready() == before + 1


def test_the_start_up_timer_times_over_a_held_hook_and_puts_it_back(clean_hooks):
    seen = []
    held = knobs.runtime.jit_cache_hook = lambda **kw: seen.append("held")
    with TritonJitTimer() as timer:
        _triton_jit()
        knobs.runtime.jit_post_compile_hook(key="k", repr="kernel")
    assert timer.kernels == 1 and seen == ["held"]
    assert knobs.runtime.jit_cache_hook is held and knobs.runtime.jit_post_compile_hook is None
