"""Python's bytecode under railyard's root (`python/`) where the installation ships none: a start that would compile
torch's sources every time (uv's installs, images with PYTHONDONTWRITEBYTECODE) compiles them once per root; an
installation with its bytecode, or a PYTHONPYCACHEPREFIX the user set, is left as it is."""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

from railyard.engine.startup.caches import BYTECODE, bytecode_cache_state, configure_bytecode_cache


@pytest.fixture
def python_state(monkeypatch):
    """Put back what configure_bytecode_cache changes in this process."""
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", sys.dont_write_bytecode)
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)


def _package(root: Path, name: str, with_bytecode: bool) -> Path:
    """An importable package `name` under root, its bytecode beside it or not."""
    source = root / name / "__init__.py"
    source.parent.mkdir(parents=True)
    source.write_text("VALUE = 42\n")
    if with_bytecode:
        py_compile.compile(str(source), cfile=importlib.util.cache_from_source(str(source)))
    return source


def test_an_installation_without_bytecode_gets_railyards(monkeypatch, tmp_path, python_state):
    _package(tmp_path / "site", "bare_pkg", with_bytecode=False)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("RAILYARD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    ours = tmp_path / "cache" / BYTECODE
    assert configure_bytecode_cache("bare_pkg") == ours
    assert sys.pycache_prefix == str(ours) and os.environ["PYTHONPYCACHEPREFIX"] == str(ours)
    assert sys.dont_write_bytecode is False


def test_a_start_says_whether_it_found_the_bytecode_there(monkeypatch, tmp_path, python_state):
    source = _package(tmp_path / "site", "bare_pkg4", with_bytecode=False)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("RAILYARD_CACHE", str(tmp_path / "cache"))
    assert bytecode_cache_state(None, "bare_pkg4") is None  # Python's own arrangement
    ours = configure_bytecode_cache("bare_pkg4")
    assert bytecode_cache_state(ours, "bare_pkg4") == "cold"
    py_compile.compile(str(source), cfile=importlib.util.cache_from_source(str(source)))  # as an import writes it
    assert bytecode_cache_state(ours, "bare_pkg4") == "warm"


def test_an_installation_with_its_bytecode_is_left_alone(monkeypatch, tmp_path, python_state):
    _package(tmp_path / "site", "compiled_pkg", with_bytecode=True)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("RAILYARD_CACHE", str(tmp_path / "cache"))
    assert configure_bytecode_cache("compiled_pkg") is None
    assert sys.pycache_prefix is None and "PYTHONPYCACHEPREFIX" not in os.environ


def test_a_prefix_the_user_chose_wins(monkeypatch, tmp_path, python_state):
    _package(tmp_path / "site", "bare_pkg2", with_bytecode=False)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("RAILYARD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path / "mine"))
    assert configure_bytecode_cache("bare_pkg2") is None
    assert sys.pycache_prefix == str(tmp_path / "mine")


def test_an_unwritable_root_leaves_python_as_it_is(monkeypatch, tmp_path, python_state):
    _package(tmp_path / "site", "bare_pkg3", with_bytecode=False)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("RAILYARD_CACHE", str(tmp_path / "file"))
    assert configure_bytecode_cache("bare_pkg3") is None and sys.pycache_prefix is None


def _import_in_child(name: str, probe: str) -> None:
    """A spawned child: multiprocessing starts it with -B where its parent set PYTHONDONTWRITEBYTECODE."""
    configure_bytecode_cache(probe)
    importlib.import_module(name)


def test_processes_started_with_dont_write_bytecode_write_theirs_under_the_root(tmp_path):
    """As a pod whose image sets PYTHONDONTWRITEBYTECODE: the front (a new interpreter) and the engine core (its
    spawned child) both leave their imports' bytecode in the root, and the next start finds it there."""
    site = tmp_path / "site"
    front_source = _package(site, "front_pkg", with_bytecode=False)
    core_source = _package(site, "core_pkg", with_bytecode=False)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "RAILYARD_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    env.pop("PYTHONPYCACHEPREFIX", None)
    script = (
        "import multiprocessing, sys\n"
        "from railyard.engine.startup.caches import configure_bytecode_cache\n"
        "from tests.engine.startup.test_bytecode_cache import _import_in_child\n"
        "if __name__ == '__main__':\n"
        "    assert sys.flags.dont_write_bytecode\n"
        "    print(configure_bytecode_cache('front_pkg'))\n"
        "    import front_pkg\n"
        "    child = multiprocessing.get_context('spawn').Process(target=_import_in_child, args=('core_pkg', 'front_pkg'))\n"
        "    child.start(); child.join(); sys.exit(child.exitcode)\n")
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=Path(__file__).parents[3], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    ours = tmp_path / "cache" / BYTECODE
    assert done.stdout.strip() == str(ours)
    for source in (front_source, core_source):
        cached = ours / str(source.parent).lstrip(os.sep) / Path(importlib.util.cache_from_source(str(source))).name
        assert cached.is_file(), sorted(p.relative_to(ours) for p in ours.rglob("*.pyc"))
    assert not (front_source.parent / "__pycache__").exists()  # nothing written beside the installation
