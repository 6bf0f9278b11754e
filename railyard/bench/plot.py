"""Latency percentiles over the run (by request start time): where in a run latency went up."""

from __future__ import annotations

from pathlib import Path

from railyard.bench.serve import PERCENTILES, RequestResult, percentile
from railyard.errors import ConfigError

_METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("latency", "end-to-end latency"))


def plot_latency_over_time(results: list[RequestResult], path: str | Path, num_windows: int = 20) -> Path:
    """Write a PNG: one panel per metric, p50/p90/p99 (ms) per window of request start times."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install matplotlib") from None
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
