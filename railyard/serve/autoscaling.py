"""Autoscaling on pending work per replica (Ray Serve custom autoscaling policy).

GPU utilisation is the wrong signal for an LLM engine: it dips between steps while the KV cache
stays resident and requests queue. What a replica cannot absorb shows up as pending requests in
its engine (running + waiting + swapped), which each replica reports through
`record_autoscaling_stats()`. Ray wraps this policy with the deployment's autoscaling_config:
`upscale_delay_s` / `downscale_delay_s` (the decision must hold that long), min/max replicas and
the smoothing factors, so thresholds and delays stay configuration.
"""

from __future__ import annotations

import math
from typing import Any

POLICY_IMPORT_PATH = "railyard.serve.autoscaling:pending_requests_policy"
# By name, for `cluster up --autoscaling-policy`: ours, and Ray Serve's default (ongoing requests per replica,
# averaged over the look-back window) as the baseline it is measured against.
POLICIES = {"pending": POLICY_IMPORT_PATH, "ray_default": "ray.serve.autoscaling_policy:default_autoscaling_policy"}
PENDING_METRIC = "pending"


def desired_replicas(total_pending: float, target_per_replica: float, min_replicas: int) -> int:
    """Fewest replicas that keep pending work per replica at or under the target."""
    if total_pending <= 0:
        return min_replicas
    return max(min_replicas, math.ceil(total_pending / target_per_replica - 1e-9))


def fleet_pending(ctx: Any) -> float:
    """Pending requests across the deployment: the engines' own counts plus requests still queued
    at handles (not yet on any replica). A replica's count is the larger of its latest report and
    its average over the look-back window: a burst counts from its first report (the upscale delay
    then decides whether it lasts, instead of the average first climbing over the window), and a fall
    counts once the window has seen it. A replica that has not reported yet is covered by Ray's count
    of ongoing requests, so a fresh replica never hides load."""
    reported = dict((ctx.aggregated_metrics or {}).get(PENDING_METRIC) or {})
    for replica, series in ((ctx.raw_metrics or {}).get(PENDING_METRIC) or {}).items():
        if series:
            reported[replica] = max(reported.get(replica, 0.0), max(series, key=lambda s: s.timestamp).value)
    queued = ctx.total_queued_requests or 0.0
    total = sum(reported.values()) + queued
    if len(reported) < len(ctx.running_replicas):
        total = max(total, ctx.total_num_requests or 0.0)
    return total


def pending_requests_policy(ctx: Any) -> tuple[int, dict[str, Any]]:
    """Ray Serve policy: replicas = ceil(pending / target_ongoing_requests), delays applied by Ray."""
    if ctx.current_num_replicas == 0:
        return ctx.target_num_replicas, {}
    target = ctx.config.get_target_ongoing_requests()
    pending = fleet_pending(ctx)
    return desired_replicas(pending, target, ctx.capacity_adjusted_min_replicas), {"pending": pending}
