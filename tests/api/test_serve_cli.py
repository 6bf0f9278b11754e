"""`railyard serve` as users start it: its own process (and its engine core's), loopback by default, a curl
example that works, a clean stop on Ctrl-C or SIGTERM that leaves no engine process behind, and start-up
failures that end in one clear line and exit code 2."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

pytestmark = pytest.mark.slow  # starts `railyard serve` processes


def start_serve(model: str, *extra: str, sigint_ignored: bool = False) -> tuple[subprocess.Popen, str]:
    """`railyard serve` on any free port; returns the process once it printed its curl example, and the banner.
    sigint_ignored: started as a background job of a non-interactive shell is, with SIGINT ignored."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "railyard.cli", "serve", "--model", model, "--port", "0", "--max-model-len", "128",
         "--num-gpu-blocks", "256", "--served-model-name", "demo", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "RAILYARD_API_KEY": ""},
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None)
    lines = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.strip().startswith("curl "):
            break
    return proc, "".join(lines)


def engine_processes(pid: int) -> list[int]:
    """The live engine processes pid spawned (Linux /proc; multiprocessing's resource tracker is not one)."""
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
                cmdline = open(f"/proc/{entry}/cmdline").read()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z" and "spawn_main" in cmdline:
                kids.append(int(entry))
    return kids


def is_alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture(scope="module")
def serve_process(tiny_model):
    proc, banner = start_serve(tiny_model)
    try:
        yield proc, banner
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)


def test_serve_binds_loopback_and_prints_a_working_curl_example(serve_process):
    proc, banner = serve_process
    url = re.search(r"on (http://\S+) ", banner).group(1)
    assert url.startswith("http://127.0.0.1:")
    curl = next(line.strip() for line in banner.splitlines() if line.strip().startswith("curl "))
    if shutil.which("curl"):
        reply = json.loads(subprocess.run(curl, shell=True, capture_output=True, text=True, timeout=60).stdout)
    else:  # the same request, read off the example
        args = shlex.split(curl)
        reply = httpx.post(args[2], content=args[args.index("-d") + 1], headers={"content-type": "application/json"},
                           timeout=60).json()
    assert reply["object"] == "chat.completion" and reply["model"] == "demo"
    assert reply["choices"][0]["message"]["role"] == "assistant"


def _health_on(sock: socket.socket) -> bytes:
    """GET /health on an open connection; the raw response, or b"" if the server had closed it."""
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: railyard\r\n\r\n")
    data = b""
    while not data.endswith(b'"ok"}'):
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def test_an_idle_connection_outlives_uvicorns_5_s_keep_alive(serve_process):
    # A client that reuses a pooled connection the server has just closed as idle loses that request, so
    # the server must keep idle connections longer than clients pool them (httpx's 5 s, aiohttp's 15 s, ...).
    _, banner = serve_process
    host, port = re.search(r"on http://([\d.]+):(\d+) ", banner).groups()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        assert _health_on(sock).startswith(b"HTTP/1.1 200")
        time.sleep(6)
        assert _health_on(sock).startswith(b"HTTP/1.1 200")


def test_serve_runs_its_engine_core_in_a_child_process(serve_process):
    proc, _ = serve_process
    assert len(engine_processes(proc.pid)) >= 1


def test_serve_stops_cleanly_on_ctrl_c_and_leaves_no_engine_process(serve_process):
    proc, _ = serve_process
    engine_pids = engine_processes(proc.pid)
    assert engine_pids
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130  # the shell's convention for Ctrl-C
    assert "Traceback" not in proc.stdout.read()
    assert not [pid for pid in engine_pids if is_alive(pid)]


@pytest.mark.parametrize("sent, sigint_ignored, code", [
    (signal.SIGTERM, False, 143),  # what Kubernetes sends a pod it stops: 128 + 15, as for Ctrl-C
    (signal.SIGINT, True, 130),  # a Ctrl-C reaching a server its shell started with SIGINT ignored
], ids=["sigterm", "sigint-inherited-ignored"])
def test_serve_stops_on_a_stop_signal_with_the_shells_exit_code_and_leaves_no_engine_process(
        tiny_model, sent, sigint_ignored, code):
    proc, banner = start_serve(tiny_model, sigint_ignored=sigint_ignored)
    try:
        assert "curl " in banner
        engine_pids = engine_processes(proc.pid)
        assert engine_pids
        proc.send_signal(sent)
        assert proc.wait(timeout=30) == code
        assert "Traceback" not in proc.stdout.read()
        assert not [pid for pid in engine_pids if is_alive(pid)]
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_port_in_use_exits_2_with_one_line_before_the_engine_loads(tiny_model):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # A KV cache too small for max_model_len fails once the engine has loaded the model: that error not showing
        # means the engine never started.
        run = subprocess.run([sys.executable, "-m", "railyard.cli", "serve", "--model", tiny_model, "--port",
                              str(port), "--max-model-len", "512", "--num-gpu-blocks", "4"],
                             capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.strip().splitlines() == [
        f"railyard serve: error: could not listen on 127.0.0.1:{port}: Address already in use; pick another --port "
        "(0: any free port)"]


def test_serve_refuses_a_missing_model_dir_with_exit_2(tmp_path):
    run = subprocess.run([sys.executable, "-m", "railyard.cli", "serve", "--model", str(tmp_path / "nope")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "railyard serve: error:" in run.stderr


def _serve_fails(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "railyard.cli", "serve", "--port", "0", *args],
                          capture_output=True, text=True, timeout=120)


def test_an_engine_whose_kv_cache_does_not_fit_exits_2_with_one_line_within_seconds(tiny_model):
    started = time.monotonic()
    run = _serve_fails("--model", tiny_model, "--max-model-len", "512", "--num-gpu-blocks", "4")
    assert time.monotonic() - started < 60
    assert run.returncode == 2 and "Traceback" not in run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("railyard serve: error:")]
    assert len(errors) == 1 and "fewer than max_model_len" in errors[0]


def test_a_model_directory_that_does_not_load_exits_2_with_one_line(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"]}')
    run = _serve_fails("--model", str(tmp_path))
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert len([line for line in run.stderr.splitlines() if line.startswith("railyard serve: error:")]) == 1


def test_a_bad_lora_module_exits_2_with_one_line_naming_it_before_the_engine_loads(tiny_model, tmp_path):
    run = _serve_fails("--model", tiny_model, "--lora-modules", f"sql={tmp_path / 'nowhere'}")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("railyard serve: error:")]
    assert len(errors) == 1 and "'sql'" in errors[0] and "is not a directory" in errors[0]
