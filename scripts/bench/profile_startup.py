"""Where an engine's start-up goes, function by function: builds the engine core in this process under cProfile
(imports included) and writes the start-up phases and the profile's top entries.

    python3 scripts/bench/profile_startup.py --model DIR_OR_SHAPE --out PREFIX [--engine-option value ...]

Writes PREFIX.txt (phases, then the top 60 by cumulative and by own time) and PREFIX.prof (pstats). The
engine's options are EngineConfig fields as `--name value` (ints, floats and booleans parsed)."""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time


def _value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    args, rest = parser.parse_known_args()
    if len(rest) % 2 or not all(name.startswith("--") for name in rest[::2]):
        parser.error(f"engine options go as --name value pairs, got {' '.join(rest)!r}")
    options = {rest[i].lstrip("-").replace("-", "_"): _value(rest[i + 1]) for i in range(0, len(rest), 2)}
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    import torch  # noqa: F401  (timed, as the engine process times its imports)

    from railyard.engine.config import EngineConfig
    from railyard.engine.core.engine_core import EngineCore
    from railyard.engine.startup.timings import StartupTimes

    core = EngineCore.from_config(EngineConfig(model=args.model, **options), StartupTimes())
    profiler.disable()
    wall = time.perf_counter() - started
    profiler.dump_stats(args.out + ".prof")
    text = io.StringIO()
    text.write(f"wall {wall:.2f} s (under cProfile)\nphases {json.dumps(core.startup.phases)}\n")
    for key in ("cumulative", "tottime"):
        text.write(f"\n== by {key}\n")
        pstats.Stats(profiler, stream=text).sort_stats(key).print_stats(60)
    open(args.out + ".txt", "w").write(text.getvalue())
    print(f"wall {wall:.2f} s; phases {json.dumps(core.startup.phases)}")
    core.shutdown()


if __name__ == "__main__":
    main()
