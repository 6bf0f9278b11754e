"""Tensor-parallel ranks meet on loopback only: the rendezvous store listens on 127.0.0.1, not on every
interface (the kernel's socket table is the oracle)."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pytest
import torch.distributed as dist

from railyard.engine.config import EngineConfig
from railyard.engine.engine import Engine
from railyard.engine.runner.tp_executor import loopback_store

pytestmark = pytest.mark.slow  # spawns tensor-parallel worker processes

LOOPBACK = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}


def listening_addresses(pid: int | str = "self") -> set[tuple[str, int]]:
    """(hex address, port) of every TCP socket a process listens on, from /proc/net/tcp{,6}."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, port = fields[1].split(":")
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.add((address, int(port, 16)))
    return found


def test_loopback_store_listens_on_127_0_0_1_only_and_serves_clients():
    store = loopback_store(2, datetime.timedelta(seconds=10))
    listening = {addr for addr, port in listening_addresses() if port == store.port}
    assert listening == {"0100007F"}
    client = dist.TCPStore("127.0.0.1", store.port, 2, is_master=False, timeout=datetime.timedelta(seconds=10))
    client.set("rank1", "ready")
    assert store.get("rank1") == b"ready"


def test_tensor_parallel_engine_opens_no_listener_beyond_loopback(tiny_model):
    before = listening_addresses()
    engine = Engine(EngineConfig(model=tiny_model, tensor_parallel_size=2, device="cpu", block_size=8,
                                 num_gpu_blocks=16, max_model_len=64))
    try:
        opened = listening_addresses() - before
        assert opened and all(addr in LOOPBACK for addr, _ in opened), opened
    finally:
        engine.shutdown()
