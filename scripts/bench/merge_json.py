"""Print one JSON object assembled from the command line: the last thing every reproduction script does.

    python3 scripts/bench/merge_json.py section="offline vs HF" commit=abc123 qwen2-7b@=$OUT/bench.json log#=$OUT/x.txt

  key=VALUE   the string VALUE
  key@=FILE   the JSON in FILE; null if FILE is missing or not JSON (the reason goes to stderr)
  key#=FILE   FILE's text, stripped; null if it is missing
A dotted key (a.b=...) nests: {"a": {"b": ...}}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def value(kind: str, raw: str) -> Any:
    if kind == "":
        return raw
    path = Path(raw)
    if not path.is_file():
        print(f"merge_json: {raw} is missing", file=sys.stderr)
        return None
    if kind == "#":
        return path.read_text(errors="replace").strip()
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        print(f"merge_json: {raw} is not JSON: {exc}", file=sys.stderr)
        return None


def main(argv: list[str]) -> int:
    out: dict[str, Any] = {}
    for arg in argv:
        key, sep, raw = arg.partition("=")
        if not sep or not key:
            print(f"merge_json: expected key=VALUE, key@=FILE or key#=FILE, got {arg!r}", file=sys.stderr)
            return 2
        kind = key[-1] if key[-1] in "@#" else ""
        *parents, leaf = (key[:-1] if kind else key).split(".")
        target = out
        for name in parents:
            target = target.setdefault(name, {})
        target[leaf] = value(kind, raw)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
