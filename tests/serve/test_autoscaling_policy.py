"""The pending-requests policy on Ray's own AutoscalingContext (the object the Serve controller passes),
and wrapped the way the controller wraps it (the delays; min/max bounds are applied after)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")
from ray.serve._private.common import DeploymentID, ReplicaID, TimeStampedValue
from ray.serve.autoscaling_policy import _apply_autoscaling_config
from ray.serve.config import AutoscalingConfig, AutoscalingContext

from railyard.serve.autoscaling import desired_replicas, pending_requests_policy

DEP = DeploymentID(name="engine-m-default", app_name="app")


def _context(pending: dict[str, float], *, replicas: int, queued: float = 0.0, ongoing: float = 0.0,
             target: float = 2.0, upscale_delay_s: float = 0.0, downscale_delay_s: float = 0.0,
             state: dict | None = None, raw: dict[str, list[tuple[float, float]]] | None = None
             ) -> AutoscalingContext:
    running = [ReplicaID(f"r{i}", DEP) for i in range(replicas)]
    config = AutoscalingConfig(min_replicas=1, max_replicas=4, target_ongoing_requests=target,
                               upscale_delay_s=upscale_delay_s, downscale_delay_s=downscale_delay_s)
    metrics = {"pending": {ReplicaID(k, DEP): v for k, v in pending.items()}}
    return AutoscalingContext(
        deployment_id=DEP, deployment_name=DEP.name, app_name=DEP.app_name, current_num_replicas=replicas,
        target_num_replicas=replicas, running_replicas=running, total_num_requests=ongoing,
        total_queued_requests=queued, aggregated_metrics=metrics,
        raw_metrics={"pending": {ReplicaID(k, DEP): [TimeStampedValue(t, v) for t, v in series]
                                 for k, series in (raw or {}).items()}},
        capacity_adjusted_min_replicas=1, capacity_adjusted_max_replicas=4, policy_state=state or {},
        last_scale_up_time=None, last_scale_down_time=None, current_time=None, config=config)


def test_replicas_follow_pending_work_over_the_target():
    assert desired_replicas(0, 2.0, 1) == 1
    assert desired_replicas(4, 2.0, 1) == 2
    assert desired_replicas(5, 2.0, 1) == 3
    assert desired_replicas(0.5, 8.0, 1) == 1


def test_the_engines_pending_counts_and_requests_queued_at_handles_add_up():
    decision, _ = pending_requests_policy(_context({"r0": 3, "r1": 2}, replicas=2, queued=3))
    assert decision == 4  # (3 + 2 + 3) / 2


def test_a_replica_that_has_not_reported_is_covered_by_rays_ongoing_count():
    decision, _ = pending_requests_policy(_context({"r0": 1}, replicas=2, ongoing=9))
    assert decision == 5


def test_a_burst_counts_from_its_latest_report_and_a_fall_once_the_window_has_seen_it():
    # the window's average still remembers the quiet seconds before the burst: the latest report decides
    rising = _context({"r0": 5}, replicas=1, raw={"r0": [(1.0, 1), (2.0, 1), (3.0, 1), (4.0, 1), (5.0, 21)]})
    assert pending_requests_policy(rising)[0] == 11
    # the load just fell: the average over the window holds the replicas until the window has seen the fall
    falling = _context({"r0": 12, "r1": 12}, replicas=2, raw={"r0": [(1.0, 16), (2.0, 2)], "r1": [(2.0, 16), (1.0, 2)]})
    assert pending_requests_policy(falling)[0] == 14  # r0: max(12, 2) = 12; r1: its latest report (t=2) is 16


def test_scale_up_waits_for_the_upscale_delay():
    policy = _apply_autoscaling_config(pending_requests_policy)
    decision, state = policy(_context({"r0": 6}, replicas=1, upscale_delay_s=600))
    assert decision == 1  # the burst has not lasted 600 s yet
    decision, _ = policy(_context({"r0": 6}, replicas=1, upscale_delay_s=0, state=state))
    assert decision == 3


def test_scale_down_waits_for_the_downscale_delay():
    policy = _apply_autoscaling_config(pending_requests_policy)
    decision, state = policy(_context({"r0": 0, "r1": 0, "r2": 0}, replicas=3, downscale_delay_s=600))
    assert decision == 3  # the low load has not lasted 600 s yet
    decision, _ = policy(_context({"r0": 0, "r1": 0, "r2": 0}, replicas=3, downscale_delay_s=0, state=state))
    assert decision == 1
