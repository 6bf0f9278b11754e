"""On a Ray of railyard's own, Serve's HAProxy binds its stats page and Prometheus exporter to loopback.

Ray Serve's HAProxy config binds them on every interface (`bind *:8404`, `bind :9101`), and Ray offers only
their port numbers as settings (RAY_SERVE_HAPROXY_STATS_PORT, RAY_SERVE_HAPROXY_METRICS_PORT). `railyard cluster
up` without --address runs everything on this machine, where nothing from outside needs them: its Ray runs
`bind_admin_ports_to_loopback` in each worker process (Ray's worker_process_setup_hook), which rewrites those two
lines of the template before the HAProxy manager renders it. A Ray cluster railyard joins keeps Ray's config.
"""

from __future__ import annotations

import logging

log = logging.getLogger("railyard.serve")

HOOK = "railyard.serve.haproxy_local.bind_admin_ports_to_loopback"
LOOPBACK_BINDS = {
    "bind *:{{ config.stats_port }}": "bind 127.0.0.1:{{ config.stats_port }}",
    "bind :{{ config.metrics_port }}": "bind 127.0.0.1:{{ config.metrics_port }}",
}


def loopback_template(template: str) -> str | None:
    """The HAProxy config template with its stats and metrics binds on 127.0.0.1; None if either bind line is not
    the one expected (another Ray version): then nothing is changed."""
    if not all(line in template for line in LOOPBACK_BINDS):
        return None
    for line, local in LOOPBACK_BINDS.items():
        template = template.replace(line, local)
    return template


def bind_admin_ports_to_loopback() -> None:
    """Ray worker_process_setup_hook: patch Serve's HAProxy config template in this worker (where Serve's HAProxy
    manager may run)."""
    try:
        from ray.serve._private import haproxy, haproxy_templates
    except ImportError:  # a Ray without Serve's HAProxy
        return
    patched = loopback_template(haproxy_templates.HAPROXY_CONFIG_TEMPLATE)
    if patched is None:
        log.warning("Ray Serve's HAProxy template has changed: its stats and metrics ports keep Ray's binds")
        return
    haproxy_templates.HAPROXY_CONFIG_TEMPLATE = haproxy.HAPROXY_CONFIG_TEMPLATE = patched
