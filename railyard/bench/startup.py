"""`railyard bench startup`: how long `railyard serve` takes from its start to /health ready, and where it goes.

Each run starts the server as a user would (its own process), polls /health from the moment it is
started, and then reads the server's start-up report from /metrics (`railyard:startup_*`). The first
run gets an empty railyard cache (a fresh $RAILYARD_CACHE: Triton compiles every kernel), the later
ones the cache the first left (warm). The checkpoint's page-cache state is set before the runs, and
measured before each one.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from railyard.bench.checkpoint import checkpoint_files, drop_from_page_cache, read_through, resident_fraction
from railyard.engine.startup.caches import BYTECODE
from railyard.envs import RAILYARD_CACHE, cache_root
from railyard.errors import RailyardError

SETTLE_S = 2.0  # between runs: the driver frees the last engine's GPU memory just after its process exits


@dataclass
class StartupRun:
    """One start of the server: its wall time to /health 200 and the server's own report."""

    cache: str  # "cold": an empty railyard cache; "warm": the cache earlier runs left
    wall_s: float  # from starting the process to the first /health 200
    page_cache_resident: float | None  # fraction of the checkpoint's pages cached as it started
    total_s: float = 0.0  # the server's phases, summed
    phases_s: dict[str, float] = field(default_factory=dict)
    weight_bytes: int = 0
    weights_gb_per_s: float | None = None
    triton_jit_s: float = 0.0
    triton_kernels: int = 0
    triton_compiled: int = 0
    weights_reader: str | None = None  # the safetensors reader's name (mapped)
    weight_parts_s: dict[str, float] = field(default_factory=dict)  # weight_loading by part: read, to_device, ...
    background_s: dict[str, float] = field(default_factory=dict)  # threads beside the phases: the front's tokenizer
    output_tail: list[str] = field(default_factory=list)  # the server's last lines (its start-up report among them)
    capture_lines: list[str] = field(default_factory=list)  # the engine's CUDA-graph capture reports (sizes, seconds)


class ServerFailed(RailyardError):
    """The server exited, or did not become healthy in time; carries the end of its output."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def startup_report(metrics_text: str) -> dict:
    """The `railyard:startup_*` gauges of a /metrics page, as StartupRun's fields."""
    out: dict = {"phases_s": {}, "weight_parts_s": {}, "background_s": {}}
    names = {"railyard:startup_seconds": "total_s", "railyard:startup_weight_bytes": "weight_bytes",
             "railyard:startup_weights_gb_per_second": "weights_gb_per_s",
             "railyard:startup_triton_jit_seconds": "triton_jit_s", "railyard:startup_triton_kernels": "triton_kernels",
             "railyard:startup_triton_compiled": "triton_compiled"}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "railyard:startup_phase_seconds":
                out["phases_s"][sample.labels["phase"]] = round(sample.value, 3)
            elif sample.name == "railyard:startup_weight_loading_seconds":
                out["weight_parts_s"][sample.labels["part"]] = round(sample.value, 3)
                out["weights_reader"] = sample.labels["reader"] or None
            elif sample.name == "railyard:startup_background_seconds":
                out["background_s"][sample.labels["task"]] = round(sample.value, 3)
            elif sample.name in names:
                out[names[sample.name]] = sample.value
    for key in ("weight_bytes", "triton_kernels", "triton_compiled"):
        if key in out:
            out[key] = int(out[key])
    if out.get("weights_gb_per_s") == 0.0:
        out["weights_gb_per_s"] = None
    return out


class ServerProcess:
    """`railyard serve` started now on a free port, its output collected; `wait_healthy` returns the seconds from
    the start to its first /health 200."""

    def __init__(self, serve_cmd: list[str], env: dict[str, str]) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        self.lines: list[str] = []
        self.started = time.perf_counter()
        self.proc = subprocess.Popen([*serve_cmd, "--port", self.url.rsplit(":", 1)[1]], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self._reader.start()

    def wait_healthy(self, client: httpx.Client, timeout_s: float) -> float:
        while True:
            try:
                if client.get(f"{self.url}/health").status_code == 200:
                    return time.perf_counter() - self.started
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None:
                raise ServerFailed(f"the server exited ({self.proc.returncode}) while starting:\n{self.tail()}")
            if time.perf_counter() - self.started > timeout_s:
                raise ServerFailed(f"the server was not healthy within {timeout_s:.0f} s:\n{self.tail()}")
            time.sleep(0.05)

    def tail(self, n: int = 20) -> str:
        return "".join(self.lines[-n:])

    def stop(self) -> None:
        """SIGINT, as Ctrl-C; killed if it does not exit within 30 s."""
        _stop(self.proc)
        self._reader.join(5.0)


def start_once(serve_cmd: list[str], env: dict[str, str], cache: str, files: list[Path],
               timeout_s: float) -> StartupRun:
    """Start the server, poll /health until 200, read /metrics, stop it."""
    resident = resident_fraction(files)
    server = ServerProcess(serve_cmd, env)
    try:
        with httpx.Client(timeout=5.0) as client:
            wall = server.wait_healthy(client, timeout_s)
            report = startup_report(client.get(f"{server.url}/metrics").text)
    finally:
        server.stop()
    return StartupRun(cache=cache, wall_s=round(wall, 3), page_cache_resident=resident,
                      output_tail=[line.rstrip() for line in server.lines[-12:]],
                      capture_lines=[line.rstrip() for line in server.lines if "CUDA graphs" in line], **report)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def serve_env(cache_dir: Path) -> dict[str, str]:
    """The environment of the measured starts: this one's, with cache_dir as railyard's root and nothing that
    would point a start at another root's caches (a TRITON_CACHE_DIR; the bytecode prefix this process chose under
    its own root): a cold start is cold for Triton's kernels and Python's bytecode alike. A prefix the user set
    stays, as it would in production."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_CACHE_DIR"}
    if env.get("PYTHONPYCACHEPREFIX") == str(cache_root() / BYTECODE):
        del env["PYTHONPYCACHEPREFIX"]
    env[RAILYARD_CACHE.name] = str(cache_dir)
    return env


def run_startup(checkpoint_dir: Path, runs: int, cache_dir: Path, page_cache: str, serve_args: list[str],
                timeout_s: float) -> dict:
    """`runs` starts of `railyard serve --model checkpoint_dir`: the first with an empty railyard cache under
    cache_dir, the rest warm; the checkpoint's pages set as `page_cache` says (warm: read once before the first
    run; drop: dropped before every run; as-is: left alone)."""
    files = checkpoint_files(checkpoint_dir)
    env = serve_env(cache_dir)
    serve_cmd = [sys.executable, "-m", "railyard.cli", "serve", "--model", str(checkpoint_dir), *serve_args]
    report: dict = {"checkpoint_dir": str(checkpoint_dir), "checkpoint_bytes": sum(f.stat().st_size for f in files),
                    "cache_dir": str(cache_dir), "page_cache": page_cache, "serve_command": serve_cmd}
    # A checkpoint just written is dirty in the page cache: its writeback to disk would run during the first starts
    # (which production never sees), so it is written back before them.
    started = time.perf_counter()
    os.sync()
    report["sync_s"] = round(time.perf_counter() - started, 3)
    if page_cache == "warm":
        report["pre_read"] = read_through(files)  # from disk, or the page cache if it already held the files
    results = []
    for i in range(runs):
        if i:
            time.sleep(SETTLE_S)
        if page_cache == "drop":
            drop_from_page_cache(files)
        results.append(start_once(serve_cmd, env, "cold" if i == 0 else "warm", files, timeout_s))
        print(f"run {i}: " + json.dumps(asdict(results[-1])), file=sys.stderr, flush=True)  # kept if a later run hangs
    report["runs"] = [asdict(r) for r in results]
    warm = [r for r in results if r.cache == "warm"]
    report["summary"] = {
        "cold_wall_s": results[0].wall_s if results else None,
        "warm_wall_s_median": statistics.median(r.wall_s for r in warm) if warm else None,
        "weights_gb_per_s": [r.weights_gb_per_s for r in results],
    }
    return report


def format_startup_table(report: dict) -> str:
    """One row per run: wall time, the server's total, the largest phases, weight GB/s, Triton."""
    rows = [f"{'run':>3} {'cache':5} {'wall s':>7} {'server s':>8} {'weights GB/s':>12} {'triton jit s':>12} "
            f"{'compiled':>8}  phases (s)"]
    for i, r in enumerate(report["runs"]):
        phases = ", ".join(f"{p} {s:.2f}" for p, s in r["phases_s"].items() if s >= 0.05)
        gbs = "-" if r["weights_gb_per_s"] is None else f"{r['weights_gb_per_s']:.2f}"
        rows.append(f"{i:>3} {r['cache']:5} {r['wall_s']:7.2f} {r['total_s']:8.2f} {gbs:>12} {r['triton_jit_s']:12.2f} "
                    f"{r['triton_compiled']:8d}  {phases}")
    return "\n".join(rows)
