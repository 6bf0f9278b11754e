"""Weight loading from the page cache to the GPU, both ways the reader can go, on one checkpoint: staged (file ->
pinned 64 MiB chunks -> device, railyard's default on a GPU) against mapped (safetensors' memory-mapped CPU
tensors copied into the parameters from pageable memory: the loader before issue 16). Prints JSON.

Usage: python3 scripts/gpu/load_paths.py CHECKPOINT_DIR [REPEATS]
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])

import torch

from railyard.bench.checkpoint import checkpoint_files, read_through, resident_fraction
from railyard.engine.attention import get_backend
from railyard.engine.models.loader import build_empty, iter_weights, weight_files
from railyard.engine.models.safetensors_reader import CheckpointReader
from railyard.model.spec import read_model_spec


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    ckpt = Path(sys.argv[1])
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    files = checkpoint_files(ckpt)
    report = {"pre_read": read_through(files), "resident": resident_fraction(files), "runs": []}
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the CPU: a dry run of this script
    spec = read_model_spec(ckpt).with_precision("bfloat16", "auto", None, device_type=dev.type)
    model = build_empty(spec, torch.bfloat16, dev, get_backend("torch", dev.type))
    reference = None
    for _ in range(repeats):
        for staged in (True, False):
            reader = CheckpointReader(dev, staged=staged)
            sync(dev)
            start = time.perf_counter()
            model.load_weights(iter_weights(weight_files(ckpt), reader))
            sync(dev)
            seconds = time.perf_counter() - start
            checksum = float(model.lm_head.weight.float().sum()) + float(model.model.layers[-1].mlp.down_proj.weight.float().sum())
            reference = checksum if reference is None else reference
            report["runs"].append({"path": "staged" if staged else "mapped", "seconds": round(seconds, 3),
                                   "gb_per_s": round(reader.bytes_read / seconds / 1e9, 3),
                                   "same_weights": checksum == reference})
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
