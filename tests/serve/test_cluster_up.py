"""`railyard cluster up` end to end on a Ray of its own: the stack's default proxy (HAProxy) answers the OpenAI API,
and SIGTERM takes the whole stack down again."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("ray")

from tests.serve.conftest import REPO_ROOT, _free_port  # noqa: E402 -- after the skip: conftest imports Ray

UP_TIMEOUT_S = 240
STOP_TIMEOUT_S = 120  # a hang guard: behind HAProxy the ingress drains 2 s on a Ray of its own, not Ray's 30


def listener_command(port: int) -> str | None:
    """The command name of the process listening on 127.0.0.1:`port` (from /proc), None if none is found."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # 0A: LISTEN
                inodes.add(fields[9])
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            sockets = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        except OSError:
            continue
        if any(f"socket:[{inode}]" in sockets for inode in inodes):
            return Path(f"/proc/{pid}/comm").read_text().strip()
    return None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ray[serve] bundles HAProxy on Linux only")
def test_cluster_up_serves_behind_haproxy_by_default_and_stops_on_sigterm(tiny_model, tmp_path):
    stack = tmp_path / "stack.yaml"
    stack.write_text(f"image: x\nmodels:\n  - name: tiny\n    model: {tiny_model}\n"
                     "    engine: {max_model_len: 256, dtype: float32, max_num_seqs: 8, torch_threads: 1}\n")
    port = _free_port()
    ray_dir = tempfile.mkdtemp(prefix="ry", dir="/tmp")  # Ray's socket paths must stay under 108 characters
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAY_SERVE_ENABLE_HA_PROXY", "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S")}
    env.update(RAY_TMPDIR=ray_dir,
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])))
    log = tmp_path / "up.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "railyard.cli", "cluster", "up", "-c", str(stack),
                                 "--port", str(port), "--cpu"], stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + UP_TIMEOUT_S
        while "Ctrl-C to stop" not in log.read_text():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)

        assert listener_command(port) == "haproxy"
        body = json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 4, "stream": True}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                         {"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status == 200
            events = [line for line in response.read().decode().splitlines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        finally:
            shutil.rmtree(ray_dir, ignore_errors=True)
    assert code == 0
    assert "railyard: stopped" in log.read_text()
    assert listener_command(port) is None  # HAProxy went with the stack
