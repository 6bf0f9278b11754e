"""The doctor's one seam to the outside: named commands run live, or read back from recorded outputs.

Every check asks a Probe for a named output (`COMMANDS`), never runs anything itself, so tests drive
the doctor with files recorded from real machines and `railyard doctor --recorded DIR` can diagnose a
node from outputs a user pasted in.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

NOT_FOUND = 127

# torch is probed in a child process so that layer 1 itself never imports it.
_TORCH_SNIPPET = (
    "import json, torch; print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, "
    "'available': torch.cuda.is_available(), 'device_count': torch.cuda.device_count()}))"
)

# railyard's kernel cache as an engine started here would use it (engine/startup/caches.py: $TRITON_CACHE_DIR, else
# $RAILYARD_CACHE/triton), read without importing railyard.
_KERNEL_CACHE_SNIPPET = (
    "import json, os, tempfile; from pathlib import Path; "
    "root = Path(os.environ.get('RAILYARD_CACHE', '~/.cache/railyard')).expanduser(); "
    "d = Path(os.environ.get('TRITON_CACHE_DIR') or root / 'triton'); "
    "kernels = sum(1 for e in os.scandir(d) if e.is_dir()) if d.is_dir() else 0; "
    "probe = d if d.is_dir() else next(p for p in [d, *d.parents] if p.exists()); "
    "writable = os.access(probe, os.W_OK | os.X_OK); "
    "last = root / 'last_start.json'; "
    "print(json.dumps({'dir': str(d), 'kernels': kernels, 'writable': writable, "
    "'last_start': json.loads(last.read_text()) if last.is_file() else None}))"
)

# name -> (argv, recorded file name)
COMMANDS: dict[str, tuple[list[str], str]] = {
    "nvidia-smi": (["nvidia-smi"], "nvidia-smi.txt"),
    "nvidia-smi-query": (
        ["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total,mig.mode.current", "--format=csv,noheader"],
        "nvidia-smi-query.csv",
    ),
    "torch": (["python3", "-c", _TORCH_SNIPPET], "torch.json"),
    "nvidia-container-cli": (["nvidia-container-cli", "--version"], "nvidia-container-cli.txt"),
    "dev-nvidia": (["sh", "-c", "stat -c '%n %a %U %G' /dev/nvidia*"], "dev-nvidia.txt"),
    "kernel-cache": (["python3", "-c", _KERNEL_CACHE_SNIPPET], "kernel-cache.json"),
    "nodes": (["kubectl", "get", "nodes", "-o", "json"], "nodes.json"),
    "daemonsets": (["kubectl", "get", "daemonsets", "--all-namespaces", "-o", "json"], "daemonsets.json"),
}


@dataclass(frozen=True)
class Output:
    """What one command printed; returncode 127 means the command does not exist here."""

    returncode: int
    stdout: str
    stderr: str = ""

    @property
    def found(self) -> bool:
        return self.returncode != NOT_FOUND

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class Probe(Protocol):
    """Anything that can produce the output of a named command."""

    def output(self, name: str) -> Output: ...


class LiveProbe:
    """Runs the commands on this machine (kubectl with an optional kubeconfig)."""

    def __init__(self, kubeconfig: str | None = None, timeout_s: float = 30.0) -> None:
        self.kubeconfig = kubeconfig
        self.timeout_s = timeout_s
        self._outputs: dict[str, Output] = {}

    def output(self, name: str) -> Output:
        """Each command runs once: several checks read `kubectl get nodes`, which can take its whole timeout."""
        if name not in self._outputs:
            self._outputs[name] = self._run(name)
        return self._outputs[name]

    def _run(self, name: str) -> Output:
        argv = list(COMMANDS[name][0])
        if argv[0] == "kubectl" and self.kubeconfig:
            argv[1:1] = ["--kubeconfig", self.kubeconfig]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s)
        except FileNotFoundError:
            return Output(NOT_FOUND, "", f"{argv[0]}: command not found")
        except subprocess.TimeoutExpired:
            return Output(124, "", f"{argv[0]} timed out after {self.timeout_s:.0f}s")
        return Output(done.returncode, done.stdout, done.stderr)


class RecordedProbe:
    """Reads outputs recorded earlier: DIR/<file> per COMMANDS; DIR/<file>.rc holds a non-zero exit code.

    A missing file stands for a missing command, which is exactly what a bare machine looks like.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def output(self, name: str) -> Output:
        path = self.directory / COMMANDS[name][1]
        if not path.exists():
            return Output(NOT_FOUND, "", f"{COMMANDS[name][0][0]}: command not found")
        rc_path = path.with_name(path.name + ".rc")
        returncode = int(rc_path.read_text().strip()) if rc_path.exists() else 0
        text = path.read_text()
        return Output(returncode, text if returncode == 0 else "", text if returncode else "")
