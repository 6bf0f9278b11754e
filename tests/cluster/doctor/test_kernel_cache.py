"""The kernel-cache check (doctor/kernel_cache.py), from recorded probe outputs: writable and filled passes and says
how the last start met it; empty or unwritable warns with the fix; no recording (a doctor run before this check
existed) skips."""

from __future__ import annotations

import json

from .conftest import by_name


def _record(recording, **info) -> None:
    (recording / "kernel-cache.json").write_text(json.dumps({"dir": "/var/cache/railyard/triton", **info}))


def test_a_filled_writable_cache_passes_and_says_how_the_last_start_met_it(recording):
    _record(recording, kernels=41, writable=True,
            last_start={"model": "/models/qwen2-7b", "kernel_cache": "warm", "triton_kernels": 41, "triton_compiled": 0})
    result = by_name(recording)["kernel cache"]
    assert result.status == "pass"
    assert "41 kernels" in result.detail and "was warm: 0 of 41 kernels compiled" in result.detail


def test_the_last_starts_python_bytecode_is_said_where_railyard_kept_it(recording):
    _record(recording, kernels=41, writable=True,
            last_start={"model": "m", "kernel_cache": "warm", "triton_kernels": 41, "triton_compiled": 0,
                        "bytecode_cache": "cold"})
    result = by_name(recording)["kernel cache"]
    assert result.status == "pass" and "its Python bytecode cold" in result.detail


def test_an_empty_cache_warns_that_the_next_start_is_cold_with_the_fill_command(recording):
    _record(recording, kernels=0, writable=True, last_start=None)
    result = by_name(recording)["kernel cache"]
    assert result.status == "warn" and "cold" in result.detail and "railyard cache fill" in result.fix


def test_an_unwritable_cache_warns_that_every_start_compiles(recording):
    _record(recording, kernels=12, writable=False, last_start=None)
    result = by_name(recording)["kernel cache"]
    assert result.status == "warn" and "every engine start compiles" in result.detail and "uid 1000" in result.fix


def test_a_recording_without_the_cache_skips_the_check(recording):
    assert by_name(recording)["kernel cache"].status == "skip"


def test_the_live_probe_reads_an_empty_cache_here(monkeypatch, tmp_path):
    from railyard.cluster.doctor.kernel_cache import check_kernel_cache
    from railyard.cluster.doctor.probe import LiveProbe

    monkeypatch.setenv("RAILYARD_CACHE", str(tmp_path))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    result = check_kernel_cache(LiveProbe())
    assert result.status == "warn" and str(tmp_path / "triton") in result.detail
    (tmp_path / "triton" / "abc123").mkdir(parents=True)
    assert check_kernel_cache(LiveProbe()).status == "pass"
