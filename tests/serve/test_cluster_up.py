"""`railyard cluster up` end to end on a Ray of its own, as a user runs it: examples/stack-cpu.yaml answers the
OpenAI API behind HAProxy (whose stats and metrics ports stay on loopback), a stack that cannot come up says why
on stderr and exits 2, and a stop signal at any moment, mid-deploy included, leaves no process behind."""

from __future__ import annotations

import json
import os
import re
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

from railyard.serve.processes import command_name, descendants  # noqa: E402
from tests.serve.conftest import REPO_ROOT, _free_port  # noqa: E402 -- after the skip: conftest imports Ray

pytestmark = [pytest.mark.ray, pytest.mark.skipif(not sys.platform.startswith("linux"),
                                                   reason="ray[serve] bundles HAProxy on Linux only")]

UP_TIMEOUT_S = 240
STOP_TIMEOUT_S = 120  # a hang guard: behind HAProxy the ingress drains 2 s on a Ray of its own, not Ray's 30
STACK_CPU = REPO_ROOT / "examples" / "stack-cpu.yaml"


def listeners(port: int) -> list[tuple[str, str]]:
    """(local address, command name) of each socket listening on `port` (from /proc)."""
    found: dict[str, str] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if os.path.exists(table):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                address, hex_port = fields[1].rsplit(":", 1)
                if int(hex_port, 16) == port and fields[3] == "0A":  # 0A: LISTEN
                    found[fields[9]] = address
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            sockets = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        except OSError:
            continue
        out += [(address, command_name(int(pid))) for inode, address in found.items() if f"socket:[{inode}]" in sockets]
    return out


LOOPBACK = "0100007F"  # 127.0.0.1 as /proc/net/tcp writes it


def left_behind(pids: list[int], wait_s: float = 30.0) -> list[int]:
    """Those of `pids` still running (zombies awaiting their reaper do not count) after up to wait_s."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = []
        for pid in pids:
            try:
                if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.append(pid)
            except OSError:
                pass
        if not alive or time.monotonic() > deadline:
            return [f"{pid} {command_name(pid)}" for pid in alive]
        time.sleep(0.2)


class ClusterUp:
    """`railyard cluster up` in its own process, its output in a file; HAProxy's admin ports on free ports."""

    def __init__(self, stack: Path, tmp_path: Path, *extra: str) -> None:
        self.port, self.stats_port, self.metrics_port = _free_port(), _free_port(), _free_port()
        self.ray_dir = tempfile.mkdtemp(prefix="ry", dir="/tmp")  # Ray's socket paths must stay under 108 characters
        env = {k: v for k, v in os.environ.items()
               if k not in ("RAY_ADDRESS", "RAY_SERVE_ENABLE_HA_PROXY", "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S")}
        env.update(RAY_TMPDIR=self.ray_dir, RAILYARD_CACHE=str(tmp_path / "cache"),
                   RAY_SERVE_HAPROXY_STATS_PORT=str(self.stats_port),
                   RAY_SERVE_HAPROXY_METRICS_PORT=str(self.metrics_port),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])))
        self.log = tmp_path / "up.log"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "railyard.cli", "cluster", "up", "-c", str(stack),
                                          "--port", str(self.port), *extra], stdout=out, stderr=subprocess.STDOUT,
                                         env=env)

    def output(self) -> str:
        return self.log.read_text()

    def wait_for(self, text: str) -> None:
        deadline = time.monotonic() + UP_TIMEOUT_S
        while text not in self.output():
            assert self.proc.poll() is None, self.output()[-3000:]
            assert time.monotonic() < deadline, self.output()[-3000:]
            time.sleep(0.2)

    def stop(self, sig: int) -> int:
        self.proc.send_signal(sig)
        return self.wait()

    def wait(self) -> int:
        try:
            return self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        finally:
            shutil.rmtree(self.ray_dir, ignore_errors=True)


def test_stack_cpu_serves_behind_haproxy_with_its_admin_ports_on_loopback_and_stops_on_sigterm(tmp_path):
    up = ClusterUp(STACK_CPU, tmp_path)
    try:
        up.wait_for("Ctrl-C to stop")
        assert "railyard: replicas: " in up.output()  # progress while the replicas started
        assert re.search(r"; Ray at [\d.]+:\d+\); Ctrl-C to stop", up.output())  # for `ray status`, serve.status()
        assert [command for _, command in listeners(up.port)] == ["haproxy"]
        for port in (up.stats_port, up.metrics_port):
            assert listeners(port) and all(address == LOOPBACK for address, _ in listeners(port)), listeners(port)
        body = json.dumps({"model": "tiny-qwen2-seed0", "prompt": "hello", "max_tokens": 4, "stream": True,
                           "temperature": 0, "ignore_eos": True}).encode()  # runs to max_tokens, whatever it samples
        request = urllib.request.Request(f"http://127.0.0.1:{up.port}/v1/completions", body,
                                         {"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status == 200
            events = [line for line in response.read().decode().splitlines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length"
        started = descendants(up.proc.pid)
    finally:
        code = up.stop(signal.SIGTERM)
    assert code == 143  # 128 + SIGTERM, as Ctrl-C's 130: a stop, not a success
    assert "railyard: stopped" in up.output()
    assert left_behind(started) == []
    assert listeners(up.port) == [] and listeners(up.stats_port) == [] and listeners(up.metrics_port) == []


def test_a_stop_signal_mid_deploy_leaves_no_process_behind(tmp_path):
    up = ClusterUp(STACK_CPU, tmp_path)
    try:
        up.wait_for("railyard: replicas: ")  # Ray is up, the replicas are starting
        started = descendants(up.proc.pid)
        assert started
    finally:
        code = up.stop(signal.SIGINT)
    assert code == 130, up.output()[-3000:]
    assert "railyard: stopped" in up.output()
    assert left_behind(started) == []
    assert listeners(up.port) == []


def _stack(tmp_path: Path, model: str, **model_fields) -> Path:
    fields = "".join(f"    {k}: {json.dumps(v)}\n" for k, v in model_fields.items())
    path = tmp_path / "stack.yaml"
    path.write_text(f"image: x\nmodels:\n  - name: tiny\n    model: {model}\n{fields}")
    return path


def test_a_missing_checkpoint_exits_2_with_one_line_before_ray_starts(tmp_path):
    up = ClusterUp(_stack(tmp_path, str(tmp_path / "nope")), tmp_path)
    assert up.wait() == 2
    out = up.output()
    assert f"railyard cluster: error: model 'tiny': model directory '{tmp_path / 'nope'}' does not exist." in out
    assert "Ray" not in out  # nothing started


def test_replicas_that_cannot_be_placed_exit_2_naming_what_they_ask_and_what_ray_has(tmp_path, tiny_model):
    up = ClusterUp(_stack(tmp_path, tiny_model, num_replicas=512), tmp_path)
    assert up.wait() == 2
    error = next(line for line in up.output().splitlines() if line.startswith("railyard cluster: error:"))
    assert "the replicas cannot be placed: they ask for {CPU: 512}" in error and "the Ray cluster has {CPU: " in error


def test_a_replica_that_fails_to_start_exits_2_with_its_error(tmp_path, tiny_model):
    # Its engine's KV cache cannot hold one max_model_len sequence: the replica's constructor raises.
    up = ClusterUp(_stack(tmp_path, tiny_model, engine={"max_model_len": 512, "num_gpu_blocks": 4}), tmp_path)
    assert up.wait() == 2
    out = up.output()
    assert "railyard cluster: error: deploy failed: engine-tiny-default failed:" in out
    assert "fewer than max_model_len" in out
