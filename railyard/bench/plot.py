"""Plots of a serving run: latency percentiles over the run (by request start time), where latency went up;
and a burst's timeline, how the fleet answered a step in traffic."""

from __future__ import annotations

from pathlib import Path

from railyard.bench.serve import PERCENTILES, RequestResult, percentile
from railyard.errors import ConfigError

def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install matplotlib") from None
    return plt


_METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("latency", "end-to-end latency"))


def plot_latency_over_time(results: list[RequestResult], path: str | Path, num_windows: int = 20) -> Path:
    """Write a PNG: one panel per metric, p50/p90/p99 (ms) per window of request start times."""
    plt = _pyplot()
    ok = sorted((r for r in results if r.ok), key=lambda r: r.start)
    if not ok:
        raise ConfigError("no request completed, so there is nothing to plot")
    span = max(ok[-1].start, 1e-9)
    windows: list[list[RequestResult]] = [[] for _ in range(num_windows)]
    for r in ok:
        windows[min(int(r.start / span * num_windows), num_windows - 1)].append(r)
    fig, axes = plt.subplots(len(_METRICS), 1, figsize=(9, 8), sharex=True)
    for ax, (attr, label) in zip(axes, _METRICS):
        for p in PERCENTILES:
            xs, ys = [], []
            for i, window in enumerate(windows):
                values = sorted(v for v in (getattr(r, attr) for r in window) if v is not None)
                if values:
                    xs.append((i + 0.5) * span / num_windows)
                    ys.append(1000 * percentile(values, p))
            ax.plot(xs, ys, marker="o", markersize=3, label=f"p{p}")
        ax.set_ylabel(f"{label} (ms)")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    axes[-1].set_xlabel("request start (s since the benchmark began)")
    fig.suptitle(f"latency percentiles over time ({len(ok)} requests)")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_burst_timeline(report: dict, path: str | Path) -> Path:
    """Write a PNG of `railyard bench burst`'s timeline: arrivals and requests in flight, running replicas
    (where known), TTFT p50/p99 per second of arrival; the burst shaded in each panel."""
    plt = _pyplot()
    rows = report["timeline"]
    t = [r["t"] + 0.5 for r in rows]
    trace = report["trace"]
    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    rate, replicas, ttft = axes
    rate.step(t, [r["arrivals"] for r in rows], where="mid", label="arrivals (req/s)")
    rate.plot(t, [r["in_flight"] for r in rows], label="in flight (client)")
    failed = [(x, r["failed"]) for x, r in zip(t, rows) if r["failed"]]
    if failed:
        rate.scatter(*zip(*failed), color="red", marker="x", label="failed", zorder=3)
    rate.set_ylabel("requests")
    if any(r["replicas"] is not None for r in rows):
        replicas.step(t, [r["replicas"] for r in rows], where="mid", label="running (Serve)")
    if any(r["replicas_serving"] is not None for r in rows):
        replicas.step(t, [r["replicas_serving"] for r in rows], where="mid", linestyle="--",
                      label="have served (ingress)")
    if not replicas.lines:
        replicas.text(0.5, 0.5, "replicas not recorded (name the Ray Serve app with --app and --deployment)",
                      ha="center", va="center", transform=replicas.transAxes, color="gray")
    replicas.set_ylabel("replicas")
    for p in (50, 99):
        points = [(x, r[f"ttft_p{p}_ms"]) for x, r in zip(t, rows) if r[f"ttft_p{p}_ms"] is not None]
        if points:
            ttft.plot(*zip(*points), marker="o", markersize=3, label=f"TTFT p{p}")
    ttft.set_ylabel("TTFT (ms)")
    ttft.set_xlabel("s since the benchmark began (TTFT by arrival second)")
    for ax in axes:
        ax.axvspan(trace["steady_s"], trace["steady_s"] + trace["burst_s"], color="orange", alpha=0.12)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", fontsize=8)
    fig.suptitle(f"burst x{trace['burst_factor']:g} of {trace['rate']:g} req/s for {trace['burst_s']:g} s "
                 f"({report['completed']} served, {report['failed']} failed)")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
