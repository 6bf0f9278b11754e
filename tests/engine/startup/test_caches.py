"""The kernel cache: where Triton writes (under $RAILYARD_CACHE unless TRITON_CACHE_DIR is set), a temporary
directory when that one is not writable (Triton would fail the compile it cannot store), and the last start's
report beside it, which `railyard doctor` reads."""

from __future__ import annotations

import json
import os

from railyard.engine.startup.caches import LAST_START, configure_triton_cache, record_start, writable


def test_triton_caches_under_railyards_root(monkeypatch, tmp_path):
    monkeypatch.setenv("RAILYARD_CACHE", str(tmp_path))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    assert configure_triton_cache() == tmp_path / "triton" and (tmp_path / "triton").is_dir()


def test_a_triton_cache_dir_the_user_set_wins(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    assert configure_triton_cache() == tmp_path / "mine"


def test_an_unwritable_cache_falls_back_to_a_temporary_one_with_a_warning(monkeypatch, tmp_path, caplog):
    (tmp_path / "file").write_text("")
    locked = tmp_path / "file" / "triton"  # under a file: no process, root or not, can create it
    monkeypatch.setenv("TRITON_CACHE_DIR", str(locked))
    used = configure_triton_cache()
    assert used != locked and writable(used) and os.environ["TRITON_CACHE_DIR"] == str(used)
    assert "not writable" in caplog.text


def test_a_file_where_the_directory_should_be_is_not_writable(tmp_path):
    (tmp_path / "file").write_text("")
    assert not writable(tmp_path / "file") and writable(tmp_path / "dir")


def test_the_last_start_is_kept_beside_the_cache_and_replaced_by_the_next(tmp_path):
    record_start({"kernel_cache": "cold", "triton_compiled": 40}, tmp_path)
    record_start({"kernel_cache": "warm", "triton_compiled": 0}, tmp_path)
    kept = json.loads((tmp_path / LAST_START).read_text())
    assert kept["kernel_cache"] == "warm" and kept["at"] > 0
    assert [p.name for p in tmp_path.iterdir()] == [LAST_START]  # no temporary file left behind


def test_a_read_only_root_keeps_no_report_and_raises_nothing(tmp_path):
    (tmp_path / "root").write_text("not a directory")
    record_start({"kernel_cache": "cold"}, tmp_path / "root")
