"""Where a benchmark's CPU time went, per process: snapshots of every process's CPU seconds from /proc, and the
difference of two as CPU% over the interval (is the Ray path short of CPU?).

    python3 scripts/bench/proc_cpu.py snapshot A.json      # before a run
    python3 scripts/bench/proc_cpu.py snapshot B.json      # after it
    python3 scripts/bench/proc_cpu.py diff A.json B.json   # JSON: interval, load, CPU% per process (busiest first)
    python3 scripts/bench/proc_cpu.py engine-cores         # PIDs of engine core processes (spawned children of a
                                                         # Ray engine replica or of `railyard serve`)
"""

from __future__ import annotations

import json
import os
import sys
import time

TICKS = os.sysconf("SC_CLK_TCK")


def _read(pid: str) -> tuple[int, float, str] | None:
    """(parent pid, CPU seconds, command line) of one process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS, cmd


def snapshot() -> dict:
    procs = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit() and (info := _read(pid)) is not None:
            procs[pid] = {"ppid": info[0], "cpu_s": info[1], "cmd": info[2][:160]}
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    return {"time": time.time(), "cpus": len(os.sched_getaffinity(0)), "loadavg": load, "procs": procs}


def diff(a: dict, b: dict, top: int = 20) -> dict:
    seconds = b["time"] - a["time"]
    rows = []
    for pid, p in b["procs"].items():
        used = p["cpu_s"] - a["procs"].get(pid, {}).get("cpu_s", 0.0)
        if used > 0.01 * seconds:
            rows.append({"pid": int(pid), "ppid": p["ppid"], "cpu_pct": round(100 * used / seconds, 1),
                         "cmd": p["cmd"][:120]})
    rows.sort(key=lambda r: -r["cpu_pct"])
    return {"interval_s": round(seconds, 2), "cpus": b["cpus"], "loadavg_after": b["loadavg"],
            "total_cpu_pct": round(sum(r["cpu_pct"] for r in rows), 1), "busiest": rows[:top]}


def engine_cores() -> list[int]:
    """Spawned children (multiprocessing's spawn_main) of a Ray engine replica or of a `railyard serve` process."""
    procs = snapshot()["procs"]
    out = []
    for pid, p in procs.items():
        parent = procs.get(str(p["ppid"]), {}).get("cmd", "")
        if "spawn_main" in p["cmd"] and ("ServeReplica" in parent and "engine" in parent or " serve " in parent):
            out.append(int(pid))
    return sorted(out)


def main(argv: list[str]) -> None:
    if argv[0] == "snapshot":
        with open(argv[1], "w") as f:
            json.dump(snapshot(), f)
    elif argv[0] == "diff":
        with open(argv[1]) as fa, open(argv[2]) as fb:
            print(json.dumps(diff(json.load(fa), json.load(fb)), indent=1))
    elif argv[0] == "engine-cores":
        print(" ".join(str(p) for p in engine_cores()))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
