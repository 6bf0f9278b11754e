"""`railyard bench burst`: what users see when traffic jumps, and how fast the fleet answers it.

The trace is a Poisson process whose rate steps: `rate` for `steady_s`, `burst_factor x rate` for
`burst_s`, `rate` again for `after_s` (a piecewise-constant rate, so each phase is drawn on its own:
exponential gaps are memoryless). Requests are sent exactly as `railyard bench serve` sends them
(`send_request`). While they run, a sampler records every `sample_period_s` the requests in flight
at the client (its queue depth), the deployment's running replicas from Ray Serve's `serve.status()`
(when an app and deployment are named) and the ingress's count of replicas that have served a
request (railyard's /metrics), which dates the first request a new replica answered, and the ingress's
per-replica time per output token, which compares a new replica's first requests with the warm
replicas' over the same seconds. The report is a per-second timeline (arrivals, in flight, replicas,
TTFT p50/p99, failures) and per-phase totals.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass

from railyard.bench.serve import (
    RequestResult, ServeBenchConfig, bench_client, fetch_metric_samples, percentile, send_request)
from railyard.bench.workload import synthetic_requests
from railyard.errors import ConfigError

PHASES = ("before", "burst", "after")
# The ingress's count of engine replicas that have started a request (railyard.serve.metrics).
REPLICAS_SERVING_METRIC = "railyard_serve_replicas_serving_total"
# The ingress's time per output token of each engine replica's finished requests (a summary: sum and count).
REPLICA_TPOT_METRIC = "railyard_serve_replica_time_per_output_token_seconds"
# How long after a new replica's first finished request its requests count as its first ones.
FIRST_REQUESTS_WINDOW_S = 10.0


@dataclass(frozen=True)
class BurstTrace:
    """Steady Poisson arrivals at `rate`, `burst_factor` times that for `burst_s`, then steady again."""

    rate: float
    burst_factor: float
    steady_s: float
    burst_s: float
    after_s: float

    def __post_init__(self) -> None:
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise ConfigError("--rate must be a positive number of requests/s")
        if not self.burst_factor >= 1:
            raise ConfigError("--burst-factor must be at least 1 (the burst multiplies the steady rate)")
        if not (self.burst_s > 0 and self.steady_s >= 0 and self.after_s >= 0):
            raise ConfigError("--burst-s must be > 0, --steady-s and --after-s >= 0")

    @property
    def burst_start(self) -> float:
        return self.steady_s

    @property
    def burst_end(self) -> float:
        return self.steady_s + self.burst_s

    @property
    def duration(self) -> float:
        return self.burst_end + self.after_s

    def phase(self, t: float) -> str:
        return "before" if t < self.burst_start else "burst" if t < self.burst_end else "after"

    def segments(self) -> list[tuple[float, float, float]]:
        """(start, end, rate) of each phase."""
        return [(0.0, self.burst_start, self.rate), (self.burst_start, self.burst_end, self.rate * self.burst_factor),
                (self.burst_end, self.duration, self.rate)]

    def arrivals(self, seed: int) -> list[float]:
        """Seeded arrival times (s from the start) of the whole trace."""
        rng = random.Random(seed)
        times = []
        for start, end, rate in self.segments():
            t = start + rng.expovariate(rate)
            while t < end:
                times.append(t)
                t += rng.expovariate(rate)
        return times


@dataclass
class Sample:
    """What the sampler saw at time `t` (s from the start); None where there is no source for it."""

    t: float
    in_flight: int
    replicas: int | None = None
    replicas_serving: float | None = None
    # replica -> (sum of its requests' time per output token in s, their count), as the ingress reported them
    replica_tpot: dict[str, tuple[float, float]] | None = None


class ServeReplicas:
    """Running replicas of one Ray Serve deployment, from `serve.status()` (connects to Ray on first use)."""

    def __init__(self, app: str, deployment: str, address: str | None = "auto") -> None:
        self.app, self.deployment, self.address = app, deployment, address

    def connect(self) -> None:
        import ray

        if not ray.is_initialized():
            try:
                ray.init(address=self.address, log_to_driver=False, logging_level="ERROR")
            except ConnectionError as exc:
                raise ConfigError(f"--app/--deployment read replicas from Ray Serve, but could not join the Ray "
                                  f"cluster at {self.address!r} ({exc}); pass its --ray-address, and with an explicit "
                                  "address to a cluster with token authentication (Ray's default for a local one) "
                                  "set RAY_AUTH_MODE=token") from None

    def __call__(self) -> int:
        from ray import serve

        app = serve.status().applications.get(self.app)
        if app is None or self.deployment not in app.deployments:
            return 0
        states = app.deployments[self.deployment].replica_states
        return sum(n for state, n in states.items() if str(getattr(state, "value", state)) == "RUNNING")


@dataclass
class BurstRun:
    results: list[RequestResult]
    samples: list[Sample]
    duration_s: float


async def run_burst(cfg: ServeBenchConfig, trace: BurstTrace, replicas: Callable[[], int] | None = None,
                    sample_period_s: float = 1.0) -> BurstRun:
    """Send the trace and sample the fleet until the last request has finished."""
    arrivals = trace.arrivals(cfg.seed)
    requests = synthetic_requests(len(arrivals), cfg.input_len, cfg.output_len, cfg.token_id_range, cfg.seed)
    in_flight = 0
    samples: list[Sample] = []
    metrics_url = cfg.url.rstrip("/") + "/metrics"

    async def one(prompt: list[int], output_len: int) -> RequestResult:
        nonlocal in_flight
        in_flight += 1
        try:
            return await send_request(client, cfg, prompt, output_len, t0)
        finally:
            in_flight -= 1

    async def sample(done: asyncio.Event) -> None:
        serving_seen = True
        while True:
            t = time.perf_counter() - t0
            count = await asyncio.to_thread(replicas) if replicas is not None else None
            serving = tpot = None
            if serving_seen:  # a server without the metric (railyard serve, another server) is asked once
                # (railyard's Ray ingress exports it from the start, at 0)
                found = await fetch_metric_samples(metrics_url, _FLEET_SAMPLES)
                serving, tpot = _fleet_metrics(found or [])
                serving_seen = serving is not None
                tpot = tpot if serving_seen else None
            samples.append(Sample(round(t, 3), in_flight, count, serving, tpot))
            if done.is_set():
                return
            try:
                await asyncio.wait_for(done.wait(), max(0.0, t0 + t + sample_period_s - time.perf_counter()))
            except asyncio.TimeoutError:
                pass

    async with bench_client(cfg) as client:
        done = asyncio.Event()
        t0 = time.perf_counter()
        sampler = asyncio.ensure_future(sample(done))
        tasks = []
        for at, req in zip(arrivals, requests):
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one(req.prompt_token_ids, req.output_len)))
        results = list(await asyncio.gather(*tasks))
        duration = time.perf_counter() - t0
        done.set()
        await sampler
    return BurstRun(results, samples, duration)


_FLEET_SAMPLES = (REPLICAS_SERVING_METRIC, REPLICA_TPOT_METRIC + "_sum", REPLICA_TPOT_METRIC + "_count")


def _fleet_metrics(found: list) -> tuple[float | None, dict[str, tuple[float, float]]]:
    """Replicas serving (None where the page lacks the metric) and each replica's (TPOT sum, count)."""
    serving = None
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for sample in found:
        if sample.name == REPLICAS_SERVING_METRIC:
            serving = (serving or 0.0) + sample.value
        elif "replica" in sample.labels:
            into = sums if sample.name.endswith("_sum") else counts
            into[sample.labels["replica"]] = into.get(sample.labels["replica"], 0.0) + sample.value
    return serving, {r: (sums.get(r, 0.0), counts[r]) for r in counts}


def new_replica_tpot(samples: list[Sample], start: float, window_s: float = FIRST_REQUESTS_WINDOW_S) -> dict | None:
    """A new replica's first requests against the warm replicas': time per output token of the requests each side
    finished from the last sample before the new replica's first finished request to `window_s` after it.

    A replica is new when it had finished none of the ingress's requests at `start` (the burst's start). None where
    no replica is new, or the samples lack per-replica counts; a note instead of figures where a replica's count
    fell between two samples (scrapes that reached different ingress replicas, each with its own counts)."""
    rows = [s for s in samples if s.replica_tpot is not None]
    if not rows:
        return None
    for a, b in zip(rows, rows[1:]):
        if any(b.replica_tpot.get(r, (0.0, 0.0))[1] < n for r, (_, n) in a.replica_tpot.items()):
            return {"note": "per-replica counts fell between samples: the scrapes reached several ingress replicas; "
                            "run the burst against a stack with one ingress replica"}
    warm = {r for s in rows if s.t <= start for r, (_, n) in s.replica_tpot.items() if n > 0}
    first = next(((s, r) for s in rows if s.t > start for r, (_, n) in s.replica_tpot.items()
                  if n > 0 and r not in warm), None)
    if first is None:
        return None
    at, new = first
    begin = max((s for s in rows if s.t < at.t), key=lambda s: s.t, default=at)
    end = next((s for s in rows if s.t >= at.t + window_s), rows[-1])

    def side(names: set[str]) -> dict:
        total = sum(end.replica_tpot.get(r, (0.0, 0.0))[0] - begin.replica_tpot.get(r, (0.0, 0.0))[0] for r in names)
        count = sum(end.replica_tpot.get(r, (0.0, 0.0))[1] - begin.replica_tpot.get(r, (0.0, 0.0))[1] for r in names)
        return {"requests": int(count), "tpot_ms": round(1000 * total / count, 3) if count else None}

    mine, theirs = side({new}), side(warm)
    speed = (round(theirs["tpot_ms"] / mine["tpot_ms"], 4)
             if mine["tpot_ms"] and theirs["tpot_ms"] else None)
    return {"replica": new, "window_s": [round(begin.t - start, 3), round(end.t - start, 3)],
            "new": mine, "warm": theirs, "speed_vs_warm": speed}


def _ms(values: list[float], p: float) -> float | None:
    return round(1000 * percentile(sorted(values), p), 3) if values else None


def timeline(run: BurstRun, trace: BurstTrace) -> list[dict]:
    """One row per second: arrivals, failures and TTFT p50/p99 of the requests that arrived in it; in flight,
    replicas and replicas serving as last sampled in it."""
    seconds = max(math.ceil(run.duration_s), math.ceil(trace.duration), 1)
    rows = [{"t": s, "phase": trace.phase(s), "arrivals": 0, "failed": 0, "in_flight": 0, "replicas": None,
             "replicas_serving": None, "_ttfts": []} for s in range(seconds)]
    for r in run.results:
        row = rows[min(int(r.start), seconds - 1)]
        row["arrivals"] += 1
        if r.ok:
            row["_ttfts"].append(r.ttft)
        else:
            row["failed"] += 1
    for s in run.samples:
        row = rows[min(int(s.t), seconds - 1)]
        row["in_flight"], row["replicas"], row["replicas_serving"] = s.in_flight, s.replicas, s.replicas_serving
    last_replicas = last_serving = None
    for row in rows:  # a second without a sample (a slow status call) carries the last known fleet
        if row["replicas"] is None:
            row["replicas"] = last_replicas
        if row["replicas_serving"] is None:
            row["replicas_serving"] = last_serving
        last_replicas, last_serving = row["replicas"], row["replicas_serving"]
        ttfts = row.pop("_ttfts")
        row["ttft_p50_ms"], row["ttft_p99_ms"] = _ms(ttfts, 50), _ms(ttfts, 99)
    return rows


def _first_after(samples: list[Sample], start: float, attr: str) -> float | None:
    """Seconds from `start` to the first sample whose `attr` exceeds its last value before `start`."""
    before = [getattr(s, attr) for s in samples if s.t <= start and getattr(s, attr) is not None]
    if not before:
        return None
    for s in samples:
        value = getattr(s, attr)
        if s.t > start and value is not None and value > before[-1]:
            return round(s.t - start, 3)
    return None


def replica_seconds(samples: list[Sample]) -> float | None:
    """The integral of running replicas over the run (each sample holds until the next)."""
    points = [(s.t, s.replicas) for s in samples if s.replicas is not None]
    if len(points) < 2:
        return None
    return round(sum(n * (t1 - t0) for (t0, n), (t1, _) in zip(points, points[1:])), 3)


def summarize_burst(cfg: ServeBenchConfig, trace: BurstTrace, run: BurstRun, sample_period_s: float) -> dict:
    """The report: the trace, totals, per-phase TTFT and failures, how the fleet answered, and the timeline."""
    failed = [r for r in run.results if not r.ok]
    phases = {}
    for name in PHASES:
        mine = [r for r in run.results if trace.phase(r.start) == name]
        ttfts = [r.ttft for r in mine if r.ok]
        phases[name] = {"requests": len(mine), "failed": sum(not r.ok for r in mine),
                        "ttft_p50_ms": _ms(ttfts, 50), "ttft_p99_ms": _ms(ttfts, 99)}
    replicas = [s.replicas for s in run.samples if s.replicas is not None]
    at_start = [s.replicas for s in run.samples if s.t <= trace.burst_start and s.replicas is not None]
    return {
        "url": cfg.url, "model": cfg.model,
        "trace": {**asdict(trace), "seed": cfg.seed, "input_len": f"{cfg.input_len.low}-{cfg.input_len.high}",
                  "output_len": f"{cfg.output_len.low}-{cfg.output_len.high}"},
        "sample_period_s": sample_period_s,
        "requests": len(run.results), "completed": len(run.results) - len(failed), "failed": len(failed),
        "error_counts": dict(sorted(Counter(r.error_type for r in failed).items())),
        "errors": sorted({r.error for r in failed})[:5],
        "duration_s": round(run.duration_s, 3),
        "phases": phases,
        "fleet": {
            "replicas_at_burst_start": at_start[-1] if at_start else None,
            "max_replicas": max(replicas) if replicas else None,
            "replica_seconds": replica_seconds(run.samples),
            # How fast the fleet answered: a replica counted RUNNING by Serve, then one that served a request.
            "burst_to_scale_up_s": _first_after(run.samples, trace.burst_start, "replicas"),
            "burst_to_new_replica_serving_s": _first_after(run.samples, trace.burst_start, "replicas_serving"),
            # Its first requests' time per output token against the warm replicas' (speed_vs_warm: warm / new).
            "new_replica_tpot": new_replica_tpot(run.samples, trace.burst_start),
        },
        "timeline": timeline(run, trace),
    }


def format_burst_table(report: dict) -> str:
    """Per-phase TTFT and failures, and the fleet's answer, for a terminal."""
    lines = [f"{'phase':<8} {'requests':>8} {'failed':>6} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12}"]
    for name, p in report["phases"].items():
        lines.append(f"{name:<8} {p['requests']:>8} {p['failed']:>6} {str(p['ttft_p50_ms']):>12} "
                     f"{str(p['ttft_p99_ms']):>12}")
    for key, value in report["fleet"].items():
        if key == "new_replica_tpot" and value and "new" in value:
            new, warm = value["new"], value["warm"]
            value = (f"{new['tpot_ms']} ms over its first {new['requests']} requests, warm replicas {warm['tpot_ms']} "
                     f"ms over {warm['requests']} (speed vs warm {value['speed_vs_warm']})")
        lines.append(f"{key.replace('_', ' ')}: {value}")
    return "\n".join(lines)
