"""railyard's logs inside Ray: a replica's and its engine core's lines (start-up, a standby engine's wake-up and
where its time went, failures) go where the Ray Serve component's own log lines go.

Why: in a Ray worker the `railyard` loggers have no handler of their own and the root logger's level is WARNING, so
without this a replica's INFO lines, and its engine core's (which inherits the level), reach no file, and a replica's
start cannot be taken apart from Ray's logs.
"""

from __future__ import annotations

import logging
import sys

SERVE_LOGGER = "ray.serve"  # Ray Serve's own component logger (its handlers: the component's file, stderr)


def log_where_serve_logs() -> None:
    """Give the `railyard` loggers this process's Ray Serve handlers, at Serve's level; outside a Serve component
    (a plain actor) a stderr handler, which Ray keeps in the worker's .err file. Engine cores started afterwards log
    at the same level."""
    serve = logging.getLogger(SERVE_LOGGER)
    ours = logging.getLogger("railyard")
    handlers = list(serve.handlers)
    if not handlers:
        stream = logging.StreamHandler(sys.stderr)
        stream.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handlers = [stream]
    ours.handlers = handlers
    ours.setLevel(serve.level if serve.handlers and serve.level else logging.INFO)
    ours.propagate = False
