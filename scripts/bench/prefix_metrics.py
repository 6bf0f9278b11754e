"""The fleet's prefix-cache tokens and routing decisions from a /metrics scrape, as one JSON object.

    python3 scripts/bench/prefix_metrics.py metrics.txt   # {"vllm:prefix_cache_hits_total": ..., ...}

Series of the same counter are summed over their labels (replicas, models), except the routing decisions'
`reason`, which stays in the key: `railyard_serve_routing_decisions_total[prefix]`.
"""

from __future__ import annotations

import json
import re
import sys

COUNTER = re.compile(r"^(vllm:prefix_cache_(?:hits|queries)_total|railyard_serve_routing\w*_total)(\{[^}]*\})? (\S+)$")


def totals(lines) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in lines:
        m = COUNTER.match(line)
        if m:
            reason = re.search(r'reason="([^"]+)"', m.group(2) or "")
            key = m.group(1) + (f"[{reason.group(1)}]" if reason else "")
            out[key] = out.get(key, 0) + float(m.group(3))
    return out


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(json.dumps(totals(f)))
