"""Background start-up work (a tokenizer's load beside the model's): its result or its error comes back, its
seconds are counted, and while it runs the GIL switch interval is short, so a loader returning from torch calls
is not held up 5 ms each time by a thread running Python; the interval is restored once no such work runs."""

from __future__ import annotations

import sys
import threading

import pytest

from railyard.engine.startup.background import SHORT_SWITCH_INTERVAL_S, Background, short_gil_switches


def test_the_result_and_the_seconds_come_back():
    job = Background(lambda a, b: a + b, 2, 3)
    assert job.result() == 5 and job.seconds >= 0.0


def test_an_error_is_raised_where_the_result_is_taken():
    def fail():
        raise ValueError("broken tokenizer")

    with pytest.raises(ValueError, match="broken tokenizer"):
        Background(fail).result()


def test_the_switch_interval_is_short_while_background_work_runs_and_restored_after():
    before = sys.getswitchinterval()
    started, release = threading.Event(), threading.Event()

    def work():
        started.set()
        release.wait(10)
        return sys.getswitchinterval()

    job = Background(work)
    started.wait(10)
    assert sys.getswitchinterval() == pytest.approx(SHORT_SWITCH_INTERVAL_S, rel=0.05)  # seen by every thread
    release.set()
    assert job.result() == pytest.approx(SHORT_SWITCH_INTERVAL_S, rel=0.05)
    assert sys.getswitchinterval() == before


def test_overlapping_blocks_restore_the_interval_only_when_the_last_one_leaves():
    before = sys.getswitchinterval()
    outer = short_gil_switches()
    outer.__enter__()
    with short_gil_switches():
        assert sys.getswitchinterval() == pytest.approx(SHORT_SWITCH_INTERVAL_S, rel=0.05)
    assert sys.getswitchinterval() == pytest.approx(SHORT_SWITCH_INTERVAL_S, rel=0.05)  # the first block still runs
    outer.__exit__(None, None, None)
    assert sys.getswitchinterval() == before


def test_an_interval_already_shorter_is_kept():
    before = sys.getswitchinterval()
    sys.setswitchinterval(SHORT_SWITCH_INTERVAL_S / 2)
    try:
        with short_gil_switches():
            assert sys.getswitchinterval() == pytest.approx(SHORT_SWITCH_INTERVAL_S / 2, rel=0.05)
    finally:
        sys.setswitchinterval(before)
