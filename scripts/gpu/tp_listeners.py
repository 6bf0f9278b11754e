"""Which TCP addresses a tensor-parallel engine listens on, as JSON (issue 13: rendezvous on loopback only).

Starts a tiny float32 engine with tensor_parallel_size N on the GPUs (NCCL), then lists the listening
sockets of this process (rank 0: the rendezvous store and NCCL's bootstrap) and of its worker processes,
from /proc/net/tcp{,6}; generates a few tokens to show the group works. Exits 1 if any listener is on a
non-loopback address.

    python scripts/gpu/tp_listeners.py --tp 2                 # needs 2 visible GPUs
    python scripts/gpu/tp_listeners.py --tp 2 --device cpu    # the same over gloo
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])

from railyard.engine.config import SamplingParams  # noqa: E402
from railyard.engine.engine import Engine  # noqa: E402
from railyard.engine.llm import LLM  # noqa: E402
from railyard.engine.tiny_model import write_tiny_checkpoint  # noqa: E402

LOOPBACK = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}


def listening(pid: int | str) -> list[dict]:
    """The listening TCP sockets a process holds: address (hex, as the kernel writes it) and port."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, port = fields[1].split(":")
            if fields[3] == "0A" and fields[9] in inodes:
                found.append({"table": table[-4:].strip("/"), "address": address, "port": int(port, 16),
                              "loopback": address in LOOPBACK})
    return found


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--device", default="cuda", help="cuda (NCCL) or cpu (gloo: tries the script anywhere)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_checkpoint(Path(tmp) / "tiny", "qwen2", num_attention_heads=8, num_key_value_heads=8,
                                     hidden_size=128)
        llm = LLM(str(path), tensor_parallel_size=args.tp, device=args.device, dtype="float32", max_model_len=64,
                  num_gpu_blocks=64)
        engine: Engine = llm.engine
        try:
            out = llm.generate(prompt_token_ids=[[1, 2, 3]], sampling_params=SamplingParams(
                temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)
            report = {"tokens": out[0].outputs[0].token_ids, "rank0": listening("self"),
                      "workers": {pid: listening(pid) for pid in engine.executor.worker_pids}}
        finally:
            engine.shutdown()
    every = report["rank0"] + [s for socks in report["workers"].values() for s in socks]
    report["all_loopback"] = all(s["loopback"] for s in every)
    print(json.dumps(report, indent=1))
    return 0 if report["all_loopback"] else 1


if __name__ == "__main__":
    sys.exit(main())
