"""Which TCP addresses a tensor-parallel engine listens on, as JSON (the rendezvous should be on loopback only).

Starts a tiny float32 engine with tensor_parallel_size N on the GPUs (NCCL), then lists the listening
sockets of this process (rank 0: the rendezvous store and NCCL's bootstrap) and of its worker processes,
from /proc/net/tcp{,6}; generates a few tokens to show the group works. Exits 1 if any listener is on a
non-loopback address.

    python scripts/dev/tp_listeners.py --tp 2                 # needs 2 visible GPUs
    python scripts/dev/tp_listeners.py --tp 2 --device cpu    # the same over gloo
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])

from railyard.engine.config import SamplingParams  # noqa: E402
from railyard.engine.engine import Engine  # noqa: E402
from railyard.engine.llm import LLM  # noqa: E402
from railyard.engine.startup.tiny_model import write_tiny_checkpoint  # noqa: E402
from tests.engine.test_tp_rendezvous import LOOPBACK, listening_addresses  # noqa: E402


def listening(pid: int | str) -> list[dict]:
    return [{"address": address, "port": port, "loopback": address in LOOPBACK}
            for address, port in sorted(listening_addresses(pid))]


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
