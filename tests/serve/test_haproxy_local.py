"""The HAProxy launcher of a Ray of railyard's own: whatever config Ray renders, HAProxy gets it with its stats
page and Prometheus exporter bound to loopback, and the rest (the HTTP frontend, the backends) as Ray wrote it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from railyard.serve.haproxy_local import install_launcher, loopback_config

RENDERED = """global
    stats socket /tmp/haproxy-serve/admin.sock mode 666 level admin
frontend prometheus
    bind :9101
    mode http
frontend http_frontend
    bind *:8000
    default_backend gpu
backend gpu
    server r1 127.0.0.1:30000 check
listen stats
  bind *:8404
  stats enable
"""


def test_only_the_admin_sections_binds_move_to_loopback():
    patched = loopback_config(RENDERED)
    assert patched is not None
    assert "frontend prometheus\n    bind 127.0.0.1:9101\n" in patched
    assert "listen stats\n  bind 127.0.0.1:8404\n" in patched
    assert "frontend http_frontend\n    bind *:8000\n" in patched  # the serving port stays as configured
    assert patched.replace("127.0.0.1:9101", ":9101").replace("127.0.0.1:8404", "*:8404") == RENDERED


def test_a_config_without_those_binds_is_not_changed():
    assert loopback_config("frontend http_frontend\n    bind *:8000\n") is None


def test_the_launcher_execs_the_binary_with_the_loopback_config_beside_rays(tmp_path):
    fake = tmp_path / "bin" / "haproxy"  # stands in for HAProxy: prints its pid, its args and the config it got
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "$$"; echo "$@"; cat "$3"\n')
    fake.chmod(0o755)
    config = tmp_path / "haproxy.cfg"
    config.write_text(RENDERED)
    launcher = install_launcher(str(fake), tmp_path / "launchers")
    assert os.access(launcher, os.X_OK)
    proc = subprocess.Popen([str(launcher), "-db", "-f", str(config), "-sf", "123"], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    out, _ = proc.communicate(timeout=60)
    pid, args, given = out.split("\n", 2)
    assert int(pid) == proc.pid  # exec'd: the process Ray started (and signals on reload) is HAProxy itself
    assert args == f"-db -f {config}.loopback -sf 123"
    assert given == loopback_config(RENDERED)
    assert config.read_text() == RENDERED  # Ray's own file as Ray wrote it


def test_launchers_of_other_binaries_do_not_overwrite_each_other(tmp_path):
    assert install_launcher("/opt/a/haproxy", tmp_path) != install_launcher("/opt/b/haproxy", tmp_path)
    assert install_launcher("/opt/a/haproxy", tmp_path) == install_launcher("/opt/a/haproxy", tmp_path)
