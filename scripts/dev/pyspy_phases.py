"""Summarise py-spy's collapsed stacks (`record --format raw --subprocesses --threads`): for each process and
thread, its samples, the functions most often on its stack (inclusive) and at its top (self).

    python3 scripts/dev/pyspy_phases.py pyspy.txt [--top 25]
"""

from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict

_LINE = re.compile(r"^(.*) (\d+)$")
# Frames on nearly every stack, which say nothing about where the time went.
_NOISE = ("<frozen ", "threading.py", "multiprocessing/", "<frozen runpy>", "(<string>)", "spawn_main")


def _key_and_frames(stack: str) -> tuple[str, list[str]]:
    """(process and thread, the frames outermost first) of one collapsed stack."""
    parts = stack.split(";")
    key = []
    while parts and (parts[0].startswith("process ") or parts[0].startswith("thread ")):
        key.append(parts.pop(0)[:90])
    return " / ".join(key) or "?", [re.sub(r":\d+\)$", ")", f) for f in parts]


def summarise(path: str, top: int) -> str:
    inclusive: dict[str, Counter] = defaultdict(Counter)
    leaf: dict[str, Counter] = defaultdict(Counter)
    samples: Counter = Counter()
    with open(path) as f:
        for line in f:
            m = _LINE.match(line.rstrip("\n"))
            if not m:
                continue
            key, frames = _key_and_frames(m.group(1))
            n = int(m.group(2))
            samples[key] += n
            for frame in set(frames):
                if not any(noise in frame for noise in _NOISE):
                    inclusive[key][frame] += n
            if frames:
                leaf[key][frames[-1]] += n
    out = []
    for key, n in samples.most_common():
        out.append(f"## {key}: {n} samples")
        out.append("  inclusive:")
        out += [f"    {c:7d} {100 * c / n:5.1f}%  {frame[:150]}" for frame, c in inclusive[key].most_common(top)]
        out.append("  self:")
        out += [f"    {c:7d} {100 * c / n:5.1f}%  {frame[:150]}" for frame, c in leaf[key].most_common(top // 2)]
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("path")
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args()
    print(summarise(args.path, args.top))


if __name__ == "__main__":
    main()
