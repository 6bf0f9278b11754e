"""On a Ray of railyard's own, Serve's HAProxy binds its stats page and Prometheus exporter to loopback.

Ray Serve's HAProxy config binds them on every interface (`bind *:8404`, `bind :9101`), and Ray offers only
their port numbers as settings (RAY_SERVE_HAPROXY_STATS_PORT, RAY_SERVE_HAPROXY_METRICS_PORT). `railyard cluster
up` without --address runs everything on this machine, where nothing from outside needs them. So it points Ray's
RAY_SERVE_HAPROXY_BINARY_PATH at a small launcher (written by `install_launcher`): every time Serve starts or
reloads HAProxy, the launcher writes the config Ray rendered with those two binds on 127.0.0.1 beside Ray's file,
then execs the real HAProxy on it (same process: Ray's PID and -sf reloads still refer to HAProxy itself).

An environment variable, not a Ray runtime_env: a job-level runtime_env (a worker setup hook) would keep every
replica of the job from taking one of the workers Ray starts ahead of time, so each new replica would first wait
for a Python worker process of its own to boot (seconds on a loaded GPU node). A Ray cluster railyard joins keeps
Ray's config.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from pathlib import Path

BINARY_ENV = "RAY_SERVE_HAPROXY_BINARY_PATH"
ADMIN_SECTIONS = ("listen stats", "frontend prometheus")  # the stats page and the Prometheus exporter
_ANY_INTERFACE_BIND = re.compile(r"^(\s*)bind\s+(?:\*|0\.0\.0\.0)?:(\d+|\{\{[^}]*\}\})\s*$")  # a port or its template


def loopback_config(config: str) -> str | None:
    """HAProxy config text (or Serve's template of it) with the admin sections' any-interface binds on 127.0.0.1;
    None if no such bind is found (another Ray version's config: then nothing is changed)."""
    lines, section, changed = [], "", 0
    for line in config.splitlines(keepends=True):
        if line[:1] not in (" ", "\t", "\n", "") and line.strip():
            section = " ".join(line.split())
        if section in ADMIN_SECTIONS and (bind := _ANY_INTERFACE_BIND.match(line.rstrip("\n"))):
            line = f"{bind.group(1)}bind 127.0.0.1:{bind.group(2)}\n"
            changed += 1
        lines.append(line)
    return "".join(lines) if changed else None


def run_haproxy(binary: str, args: list[str]) -> None:
    """Exec HAProxy with args, its `-f CONFIG` replaced by CONFIG's loopback version (CONFIG.loopback)."""
    args = list(args)
    if "-f" in args[:-1]:
        at = args.index("-f") + 1
        config = Path(args[at])
        patched = loopback_config(config.read_text())
        if patched is not None:
            local = config.with_name(config.name + ".loopback")
            tmp = local.with_name(local.name + f".{os.getpid()}")
            tmp.write_text(patched)
            tmp.replace(local)  # a reload never reads a half-written file
            args[at] = str(local)
        else:
            print(f"railyard: HAProxy config {config} has no stats/metrics bind railyard knows: kept as Ray wrote it",
                  file=sys.stderr)
    os.execv(binary, [binary, *args])


def install_launcher(binary: str, directory: Path) -> Path:
    """Write the launcher of `binary` into directory (an executable file Ray can run as its HAProxy binary), named
    for this Python and that binary, so stacks started from other installs keep their own."""
    directory.mkdir(parents=True, exist_ok=True)
    launcher = directory / f"haproxy-{hashlib.sha256(f'{sys.executable}:{binary}'.encode()).hexdigest()[:12]}"
    tmp = directory / f".{launcher.name}.{os.getpid()}"
    tmp.write_text(f"#!{sys.executable}\n"
                   "import sys\n"
                   "from railyard.serve.haproxy_local import run_haproxy\n"
                   f"run_haproxy({binary!r}, sys.argv[1:])\n")
    tmp.chmod(0o755)
    tmp.replace(launcher)
    return launcher
