"""Ray-level metrics for /metrics, next to the engine's: routing decisions, replicas, scale events.

Routers run inside the ingress replica (its deployment handles route there), so their counters
land in the same prometheus registry the OpenAI app exposes. Replica counts and scale events come
from the Serve controller's status, polled by the ingress (`ReplicaWatcher`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from prometheus_client import Counter, Gauge, Summary

log = logging.getLogger("railyard.serve")

ROUTING_DECISIONS = Counter(
    "railyard_serve_routing_decisions", "Requests routed to an engine replica, by why the replica won",
    ["deployment", "reason"])
ROUTABLE_REPLICAS = Gauge(
    "railyard_serve_routable_replicas", "Replicas this router may send to", ["deployment"])
REPLICAS = Gauge(
    "railyard_serve_replicas", "Replicas of an engine deployment by state (Serve controller)",
    ["deployment", "state"])
SCALE_EVENTS = Counter(
    "railyard_serve_scale_events", "Changes of a deployment's running replica count", ["deployment", "direction"])
REPLICAS_SERVING = Counter(
    "railyard_serve_replicas_serving", "Engine replicas that have started a request of this ingress: a new replica's "
    "first request adds one (how long a burst waited for new capacity)", ["model"])
REPLICA_TPOT = Summary(
    "railyard_serve_replica_time_per_output_token_seconds", "Time per output token of the requests each engine "
    "replica finished for this ingress (its sum and count: a new replica's first requests against the warm ones')",
    ["model", "replica"])
RETRIES = Counter(
    "railyard_serve_retries", "Requests re-sent to another replica because theirs died before the first token",
    ["model"])


def record_routing_decision(deployment: str, reason: str) -> None:
    ROUTING_DECISIONS.labels(deployment, reason).inc()


def set_routable_replicas(deployment: str, count: int) -> None:
    ROUTABLE_REPLICAS.labels(deployment).set(count)


class ReplicaWatcher:
    """Polls the Serve controller for replica states of some deployments and counts scale events."""

    def __init__(self, app_name: str, deployments: Iterable[str], period_s: float = 2.0) -> None:
        self.app_name = app_name
        self.deployments = list(deployments)
        self.period_s = period_s
        self._running: dict[str, int] = {}
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        from ray import serve

        while True:
            try:
                status = await asyncio.to_thread(serve.status)
                app = status.applications.get(self.app_name)
                if app is not None:
                    self.observe({name: {str(getattr(s, "value", s)): n for s, n in d.replica_states.items()}
                                  for name, d in app.deployments.items() if name in self.deployments})
            # the controller may be restarting; metrics never take the ingress down
            except Exception as exc:  # noqa: BLE001
                log.debug("replica watcher: %s", exc)
            await asyncio.sleep(self.period_s)

    def observe(self, states: dict[str, dict[str, int]]) -> None:
        """Record one snapshot {deployment: {state: count}}; a changed RUNNING count is a scale event."""
        for name, by_state in states.items():
            for state, count in by_state.items():
                REPLICAS.labels(name, state).set(count)
            running = by_state.get("RUNNING", 0)
            before = self._running.get(name)
            if before is not None and running != before:
                SCALE_EVENTS.labels(name, "up" if running > before else "down").inc()
            self._running[name] = running
