"""`railyard ...` with INFO logging on stderr (the engine's start-up memory report), for GPU runs.

Usage: python3 scripts/gpu/cli.py bench throughput --model qwen2-7b ...
"""

import logging
import sys

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)

from railyard.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
