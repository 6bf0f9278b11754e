"""`railyard serve` as users start it: its own process, loopback by default, a curl example that works."""

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


@pytest.fixture(scope="module")
def serve_process(tiny_model):
    proc = subprocess.Popen(
        [sys.executable, "-m", "railyard.cli", "serve", "--model", tiny_model, "--port", "0", "--max-model-len", "128",
         "--num-gpu-blocks", "256", "--served-model-name", "demo"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "RAILYARD_API_KEY": ""})
    lines = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.strip().startswith("curl "):
            break
    try:
        yield proc, "".join(lines)
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


def test_serve_stops_cleanly_on_ctrl_c(serve_process):
    proc, _ = serve_process
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130  # the shell's convention for Ctrl-C
    assert "Traceback" not in proc.stdout.read()


def test_serve_refuses_a_missing_model_dir_with_exit_2(tmp_path):
    run = subprocess.run([sys.executable, "-m", "railyard.cli", "serve", "--model", str(tmp_path / "nope")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "railyard serve: error:" in run.stderr
