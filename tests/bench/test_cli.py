"""`railyard bench throughput` as a new user meets it: the embedded model by name, a progress bar on a
terminal, and no roofline percentage against ceilings of a device it is not running on."""

from __future__ import annotations

import io
import json
import sys

import pytest

from railyard.bench.roofline import H100_HBM_TBS, H100_PEAK_TFLOPS, H200_HBM_TBS, H200_PEAK_TFLOPS, device_peaks
from railyard.cli import main

SMALL = ["--num-prompts", "3", "--input-len", "8", "--output-len", "2", "--warmup-prompts", "1"]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_peaks_are_known_for_an_h200_given_ones_win_and_others_have_none():
    assert device_peaks("NVIDIA H200") == (H200_PEAK_TFLOPS, H200_HBM_TBS)
    assert device_peaks("NVIDIA H200", peak_tflops=700.0) == (700.0, H200_HBM_TBS)
    assert device_peaks("NVIDIA H100 80GB HBM3") == (H100_PEAK_TFLOPS, H100_HBM_TBS)
    assert device_peaks("NVIDIA H100 PCIe") is None  # another part, other ceilings
    assert device_peaks("NVIDIA A100-SXM4-80GB") is None and device_peaks("cpu") is None
    assert device_peaks("cpu", peak_tflops=1.0) is None  # half a roofline is no roofline
    assert device_peaks("cpu", peak_tflops=1.0, hbm_tbs=0.1) == (1.0, 0.1)


def test_on_a_device_of_unknown_peak_no_roofline_percentage_is_printed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RAILYARD_CACHE", str(tmp_path))
    assert main(["bench", "throughput", "--model", "tiny-qwen2-seed0", *SMALL]) == 0  # the embedded model by name
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["percent_of_roofline"] is None and report["roofline"] is None
    assert "--peak-tflops and --hbm-tbs" in report["roofline_note"] and "% of roofline" not in err


def test_given_peaks_give_a_roofline_percentage(tiny_model, capsys):
    # Ceilings this low (a GFLOP/s, a GB/s) make the tiny model's floor long enough to show.
    assert main(["bench", "throughput", "--model", tiny_model, *SMALL, "--peak-tflops", "0.001", "--hbm-tbs",
                 "0.001"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["roofline"]["peak_tflops"] == 0.001 and report["roofline"]["hbm_tbs"] == 0.001
    # The percentage is the floor over the measured time, rounded to 0.1; the ratio is the measured time over the
    # floor, rounded to 3 decimals: the unrounded ratio lies within 0.0005 of it, and the percentage within 0.05 of
    # 100 over that; the report rounds the floor to 4 decimals (a relative error of at most 0.00005 s over the floor).
    ratio, floor_s = report["measured_over_roofline"], report["roofline"]["total_s"]
    assert 100 / (ratio + 0.0005) - 0.05 - 1e-6 <= report["percent_of_roofline"] <= 100 / (ratio - 0.0005) + 0.05 + 1e-6
    assert ratio == pytest.approx(report["elapsed_s"] / floor_s, rel=0.5e-4 / floor_s + 1e-3)


def test_progress_bars_show_on_a_terminal(tiny_model, monkeypatch, capsys):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["bench", "throughput", "--model", tiny_model, *SMALL]) == 0
    assert "warmup: 100%" in terminal.getvalue() and "bench: 100%" in terminal.getvalue()
