"""Where an engine's start-up time goes: phase durations, weight-load throughput, Triton JIT compiles.

A replica is useless until it is ready, and on a GPU most of that wait is imports, weight loading,
the KV memory profile, CUDA-graph capture and Triton compiling its kernels (vllm #19824). The engine
times each phase as it starts (`StartupTimes`), the server adds its own and reports them once in the
log and as `railyard:startup_phase_seconds{phase=...}`; `railyard bench startup` reads them back.

Phases are exclusive and in start-up order, so they add up to at most the wall time. Triton's JIT runs
inside some of them (the profile step and graph capture launch every kernel first): its seconds are
reported beside the phases (`triton_jit_s`), as a part of them, not added to them. So is weight loading's own
split (`weight_parts`: reading the files, copying to the device, converting and copying into the parameters)
and the work the engine ran on threads beside the phases (`background`: its tokenizer's load).
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

# Where weight loading's seconds went: file -> host memory, the reader's copies to the device (none: the mapped
# reader leaves them to the model), converting and copying into the parameters, and the rest (the reader's set-up,
# waiting for the device at the end).
# The mapped reader's tensors are views of the mapped file, so its reading (page faults on the page cache) happens in
# the copy into the parameters and shows there: its read part is only safetensors' bookkeeping.
WEIGHT_PARTS = ("read", "to_device", "copy", "other")
# The order phases happen in (a phase that did not happen is absent). piecewise_graphs: capturing the pieces of every
# step but pure decode, beside the weights' load; cuda_graphs: capturing whole decode steps.
PHASE_ORDER = ("front_imports", "engine_spawn", "imports", "tokenizer_eos", "model_construction", "piecewise_graphs",
               "weight_loading", "weights_to_device", "kv_profile", "kv_allocation", "cuda_graphs", "warm_up",
               "executor", "engine_other", "heap_freeze", "front_tokenizer", "front_imports_wait", "server_start")


@dataclass(frozen=True)
class WeightLoad:
    """What filling a model from its checkpoint did: bytes read, by which reader, and its seconds by part."""

    bytes: int
    reader: str
    read_s: float
    to_device_s: float
    copy_s: float


@dataclass
class StartupTimes:
    """Seconds per start-up phase (exclusive, PHASE_ORDER), and what the weights and Triton did in them."""

    phases: dict[str, float] = field(default_factory=dict)
    weight_bytes: int = 0
    triton_jit_s: float = 0.0  # within kv_profile and the graphs' capture: Triton compiling or loading kernels
    triton_kernels: int = 0  # kernel specialisations JIT'd during start-up (compiled, or loaded from the cache)
    triton_compiled: int = 0  # of those, compiled anew: entries added to the Triton cache (its misses)
    triton_cache_dir: str | None = None
    # How the engine's imports met railyard's Python bytecode (caches.py): "cold" (compiled torch's sources),
    # "warm" (read their bytecode); None where the installation ships its own
    bytecode_cache: str | None = None
    weights_reader: str | None = None  # the safetensors reader's name (mapped)
    weight_parts: dict[str, float] = field(default_factory=dict)  # within the load's seconds, WEIGHT_PARTS
    # Seconds of work run on threads beside the phases: the front's tokenizer; "weights", a load beside the CUDA
    # graphs' capture (the weight_loading phase is then only what the capture did not hide).
    background: dict[str, float] = field(default_factory=dict)

    def add(self, phase: str, seconds: float) -> None:
        self.phases[phase] = self.phases.get(phase, 0.0) + max(0.0, seconds)

    @contextmanager
    def phase(self, name: str):
        """Time the block as `name` (added to what the phase already has)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def add_rest(self, phase: str, since: float) -> None:
        """Add as `phase` what of the time since `since` (time.time()) no phase accounts for."""
        self.add(phase, time.time() - since - self.total_s)

    def merge(self, other: "StartupTimes") -> None:
        """Add another part's phases and counts (the executor's, into the engine's)."""
        for name, seconds in other.phases.items():
            self.add(name, seconds)
        self.weight_bytes += other.weight_bytes
        self.triton_jit_s += other.triton_jit_s
        self.triton_kernels += other.triton_kernels
        self.triton_compiled += other.triton_compiled
        self.triton_cache_dir = self.triton_cache_dir or other.triton_cache_dir
        self.bytecode_cache = self.bytecode_cache or other.bytecode_cache
        self.weights_reader = self.weights_reader or other.weights_reader
        for name, seconds in other.weight_parts.items():
            self.weight_parts[name] = self.weight_parts.get(name, 0.0) + seconds
        for name, seconds in other.background.items():
            self.background[name] = self.background.get(name, 0.0) + seconds

    @property
    def total_s(self) -> float:
        return sum(self.phases.values())

    @property
    def kernel_cache(self) -> str | None:
        """How the start met its Triton kernel cache: "cold" (every kernel it JIT'd was compiled anew), "warm" (all
        loaded from the cache), "partial" (some of each); None where no kernel was JIT'd (CPU, or a process that had
        them in memory already)."""
        if not self.triton_kernels:
            return None
        if not self.triton_compiled:
            return "warm"
        return "cold" if self.triton_compiled >= self.triton_kernels else "partial"

    @property
    def weights_gb_per_s(self) -> float | None:
        seconds = self.background["weights"] if "weights" in self.background else self.phases.get("weight_loading", 0.0)
        return self.weight_bytes / seconds / 1e9 if self.weight_bytes and seconds > 0 else None

    def record_weights(self, load: WeightLoad, seconds: float, beside: bool = False) -> None:
        """What fill_from_checkpoint measured, in a load of `seconds`: the weight_loading phase, or with beside a
        load on a thread beside the graphs' capture (also a `background` entry then)."""
        self.weight_bytes = load.bytes
        self.weights_reader = load.reader
        self.weight_parts = {"read": load.read_s, "to_device": load.to_device_s, "copy": load.copy_s,
                             "other": max(0.0, seconds - load.read_s - load.to_device_s - load.copy_s)}
        if beside:
            self.background["weights"] = self.background.get("weights", 0.0) + seconds

    def ordered(self) -> list[tuple[str, float]]:
        known = [(p, self.phases[p]) for p in PHASE_ORDER if p in self.phases]
        return known + sorted((p, s) for p, s in self.phases.items() if p not in PHASE_ORDER)

    def describe(self, what: str = "start-up") -> str:
        """The one start-up log line (what: "wake-up" for sleep mode's wake-up, timed the same way)."""
        parts = [f"{name} {seconds:.2f}" for name, seconds in self.ordered()]
        line = f"{what}: total {self.total_s:.2f} s = " + " + ".join(parts)
        caches = [f"{state} {name}" for state, name in ((self.kernel_cache, "kernel cache"),
                                                         (self.bytecode_cache, "Python bytecode")) if state]
        if caches:
            line = f"{what} ({', '.join(caches)}):" + line.removeprefix(f"{what}:")
        rate = self.weights_gb_per_s
        if rate is not None:
            line += f"; weights {readable_bytes(self.weight_bytes)} at {rate:.2f} GB/s"
            if self.weight_parts:
                line += f" ({self.weights_reader}: " + " + ".join(
                    f"{p} {self.weight_parts[p]:.2f}" for p in WEIGHT_PARTS if p in self.weight_parts) + ")"
        if self.background:
            line += "; beside them " + ", ".join(f"{name} {s:.2f} s" for name, s in sorted(self.background.items()))
        if self.triton_kernels or self.triton_cache_dir:
            line += (f"; Triton JIT {self.triton_jit_s:.2f} s (within the phases) for {self.triton_kernels} kernels, "
                     f"{self.triton_compiled} compiled anew, cache {self.triton_cache_dir}")
        return line

    def as_dict(self) -> dict:
        rate = self.weights_gb_per_s
        return {"total_s": round(self.total_s, 3), "phases_s": {p: round(s, 3) for p, s in self.ordered()},
                "weight_bytes": self.weight_bytes, "weights_gb_per_s": None if rate is None else round(rate, 3),
                "triton_jit_s": round(self.triton_jit_s, 3), "triton_kernels": self.triton_kernels,
                "triton_compiled": self.triton_compiled, "triton_cache_dir": self.triton_cache_dir,
                "kernel_cache": self.kernel_cache, "bytecode_cache": self.bytecode_cache,
                "weights_reader": self.weights_reader,
                "weight_parts_s": {p: round(s, 3) for p, s in self.weight_parts.items()},
                "background_s": {n: round(s, 3) for n, s in self.background.items()}}


class TritonJitTimer:
    """Times Triton's JIT while installed: from its cache hook (before it compiles or loads a kernel) to its
    post-compile hook, and counts the kernels it compiled anew as the new entries of its cache directory.

    Hooks held before it (jit_watch's, a profiler's) run after its own, their answer standing; they are put back
    on exit. Does nothing where Triton is absent."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled  # off on the CPU: no Triton to import there
        self.seconds = 0.0
        self.kernels = 0
        self._started: list[float] = []
        self._installed = False
        self._knobs = None
        self._held: tuple = (None, None)  # the cache and post-compile hooks held before it
        self.cache_dir: Path | None = None
        self._entries_before = 0

    def __enter__(self) -> "TritonJitTimer":
        if not self.enabled:
            return self
        try:
            from triton import knobs
        except Exception:  # no Triton (CPU-only installs): nothing compiles
            return self
        rt = knobs.runtime
        self._knobs = rt
        self._held = (rt.jit_cache_hook, rt.jit_post_compile_hook)
        rt.jit_cache_hook, rt.jit_post_compile_hook = self._before, self._after
        self._installed = True
        self.cache_dir = Path(knobs.cache.dir)
        self._entries_before = _count_entries(self.cache_dir)
        return self

    def _before(self, **kwargs) -> bool | None:  # True would make Triton skip the compile: only a held hook's
        self._started.append(time.perf_counter())
        held = self._held[0]
        return held(**kwargs) if held is not None else None

    def _after(self, **kwargs) -> None:
        if self._started:
            self.seconds += time.perf_counter() - self._started.pop()
        self.kernels += 1
        if self._held[1] is not None:
            self._held[1](**kwargs)

    @property
    def compiled(self) -> int:
        return max(0, _count_entries(self.cache_dir) - self._entries_before) if self.cache_dir else 0

    def __exit__(self, *exc) -> None:
        if self._installed:
            self._knobs.jit_cache_hook, self._knobs.jit_post_compile_hook = self._held
            self._installed = False

    def record(self, times: StartupTimes) -> None:
        times.triton_jit_s += self.seconds
        times.triton_kernels += self.kernels
        times.triton_compiled += self.compiled
        if self.cache_dir is not None:
            times.triton_cache_dir = str(self.cache_dir)


def _count_entries(cache_dir: Path) -> int:
    """Compiled kernels in a Triton cache: one directory (named by the kernel's hash) each."""
    try:
        return sum(1 for entry in os.scandir(cache_dir) if entry.is_dir())
    except OSError:
        return 0


def readable_bytes(n: int) -> str:
    """A size in the unit that shows it (decimal, as the GB/s beside it): a tiny model's weights are not "0.00 GB"."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"
