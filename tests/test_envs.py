"""railyard.envs is the one registry of the environment variables railyard reads: every RAILYARD_* name the
package mentions is registered there, with a line of doc."""

from __future__ import annotations

import re
from pathlib import Path

from railyard import envs

PACKAGE = Path(__file__).resolve().parents[1] / "railyard"


def test_every_railyard_variable_the_package_names_is_registered_with_a_doc():
    named = {m for p in PACKAGE.rglob("*.py") for m in re.findall(r"RAILYARD_[A-Z0-9_]+", p.read_text())}
    assert named <= set(envs.VARIABLES), sorted(named - set(envs.VARIABLES))
    assert all(v.doc and v.name == name for name, v in envs.VARIABLES.items())


def test_the_cache_root_is_the_variable_or_the_home_default(monkeypatch, tmp_path):
    monkeypatch.setenv("RAILYARD_CACHE", str(tmp_path))
    assert envs.cache_root() == tmp_path
    monkeypatch.delenv("RAILYARD_CACHE")
    assert envs.cache_root() == Path.home() / ".cache" / "railyard"
