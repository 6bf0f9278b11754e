"""`railyard ...` with INFO logging on stderr (the engine's start-up memory report), for GPU runs.

Usage: python3 scripts/bench/cli.py bench throughput --model qwen2-7b ...
"""

import logging
import sys

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])

if __name__ == "__main__":  # the engine process is spawned: it re-imports this file and must not run it
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)

    from railyard.cli import entry

    sys.exit(entry())
