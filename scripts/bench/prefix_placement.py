"""Where a shared-prefix trace's requests went, read from Ray Serve's access logs (no instrumentation needed).

`railyard bench serve --prefix-groups G` sends request i with group i % G's prefix. Every ingress and engine replica
logs one access line per request with the proxy's request id and its duration; joining them gives, per request,
the ingress that routed it and the engine replica that served it. A group served by k replicas had its prefix
computed at least k times in the fleet.

  python scripts/bench/prefix_placement.py RAY_SESSION/logs/serve --groups 64 --requests 384
  (the trace's requests are the last N completions logged by the ingresses; Ray logs of ray-serve-gpu.sh come in
  $OUT/ray_logs.tgz, one session per stack)
Prints JSON: groups split over replicas, extra prefix computations, requests per (ingress, replica) pair per round.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
from collections import Counter
from pathlib import Path

_LINE = re.compile(r"INFO (\S+ \S+) \S+ \S+ ([0-9a-f-]{36}) -- (.*) (\d+\.\d+)ms")


def access_lines(path: Path) -> dict[str, tuple[float, str]]:
    """request id -> (start time in seconds, what), from one replica's log."""
    out = {}
    for line in path.read_text(errors="replace").splitlines():
        m = _LINE.match(line)
        if m:
            end = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out[m.group(2)] = (end - float(m.group(4)) / 1000, m.group(3))
    return out


def replica(log: Path) -> str:
    """The replica id in a Serve log's name: replica_<app>_<deployment>_<id>.log."""
    return log.stem.rsplit("_", 1)[-1]


def placement(serve_logs: Path, groups: int, requests: int) -> dict:
    """Per group, the engine replicas that served it; the requests are taken in their start order."""
    engines = {replica(p): access_lines(p) for p in serve_logs.glob("replica_*engine*.log")}
    served = []
    for p in serve_logs.glob("replica_*ingress*.log"):
        for rid, (start, what) in access_lines(p).items():
            if what.startswith("POST /v1/"):
                engine = next((e for e, lines in engines.items() if rid in lines), None)
                served.append((start, replica(p), engine))
    served.sort(key=lambda s: s[0])  # by start; a tie must not compare an unknown engine (None) with a name
    trace = served[-requests:]
    by_group: dict[int, set] = {}
    for i, (_, _, engine) in enumerate(trace):
        if engine is not None:  # its engine line not (yet) written: unknown, not a third replica
            by_group.setdefault(i % groups, set()).add(engine)
    rounds = [Counter(f"{ing}->{eng}" for _, ing, eng in trace[k:k + groups]) for k in range(0, len(trace), groups)]
    return {"requests": len(trace), "groups": groups,
            "requests_without_engine_line": sum(engine is None for _, _, engine in trace),
            "groups_split": sum(len(e) > 1 for e in by_group.values()),
            "extra_prefix_computations": sum(len(e) - 1 for e in by_group.values()),
            "per_round_ingress_to_replica": [dict(r) for r in rounds]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("serve_logs", type=Path, help="a Ray session's logs/serve folder")
    p.add_argument("--groups", type=int, required=True)
    p.add_argument("--requests", type=int, required=True)
    args = p.parse_args()
    print(json.dumps(placement(args.serve_logs, args.groups, args.requests), indent=1))


if __name__ == "__main__":
    main()
