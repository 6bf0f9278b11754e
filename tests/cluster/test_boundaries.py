"""Layer 1 depends on the stack config only: no engine, serve, api, torch or ray behind its imports."""

from __future__ import annotations

import subprocess
import sys


def test_cluster_modules_import_nothing_from_other_layers():
    code = (
        "import importlib, pkgutil, sys, railyard.cluster as c\n"
        "for m in pkgutil.iter_modules(c.__path__): importlib.import_module('railyard.cluster.' + m.name)\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in ('torch', 'ray') "
        "or n.startswith(('railyard.engine', 'railyard.serve', 'railyard.api', 'railyard.bench')))\n"
        "print(','.join(bad))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""
