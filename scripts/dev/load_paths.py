"""Weight loading from the page cache to the GPU, both ways the reader can go, alone and as the engine does it, on
one checkpoint. Prints JSON.

1. rounds: one process builds the model once and loads it REPEATS times by each reader: staged (file -> pinned
   64 MiB chunks -> device) and mapped (safetensors' memory-mapped tensors copied into the parameters from
   pageable memory), as the first H200 call measured them (4.8-5.2 and 7.3-7.5 GB/s).
2. fresh: each load in a fresh process (as in `railyard serve`: the first load of the process), by each reader,
   alone and beside the engine's tokenizer load (importing transformers): on a plain thread, as the engine did
   before issue 16 (the GIL switch interval at its 5 ms), and on railyard's Background (short GIL switches).
   If the tokenizer thread makes the load slower, and short switches take that back, that was the server's
   slowness (server 1.5-2.1 GB/s against 4.8-7.5 here alone).
3. disk (with DROP=1, the default): the page cache dropped before a fresh mapped and a fresh staged load: the
   case for keeping the staged reader.

Usage: python3 scripts/dev/load_paths.py CHECKPOINT_DIR [REPEATS [OUTPUT]]   (OUTPUT: the JSON so far, after each step)
       python3 scripts/dev/load_paths.py CHECKPOINT_DIR --one {mapped,staged} {alone,thread,background}
"""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])

import torch

from railyard.bench.checkpoint import checkpoint_files, drop_from_page_cache, read_through, resident_fraction
from railyard.engine.runner.attention import get_backend
from railyard.engine.runner.models.loader import build_empty, fill_from_checkpoint, iter_weights, weight_files
from railyard.engine.runner.models.safetensors_reader import READER_ENV, CheckpointReader
from railyard.model.spec import read_model_spec

ONE_TIMEOUT_S = 120


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def built(ckpt: Path) -> tuple[torch.nn.Module, torch.device]:
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the CPU: a dry run of this script
    spec = read_model_spec(ckpt).with_precision("bfloat16", "auto", None, device_type=dev.type)
    model = build_empty(spec, torch.bfloat16, dev, get_backend("torch", dev.type))
    sync(dev)
    return model, dev


def checksum(model) -> float:
    return float(model.lm_head.weight.float().sum()) + float(model.model.layers[-1].mlp.down_proj.weight.float().sum())


def rounds(ckpt: Path, repeats: int) -> list[dict]:
    model, dev = built(ckpt)
    out, reference = [], None
    for _ in range(repeats):
        for staged in (True, False):
            reader = CheckpointReader(dev, staged=staged)
            sync(dev)
            start = time.perf_counter()
            model.load_weights(iter_weights(weight_files(ckpt), reader))
            sync(dev)
            seconds = time.perf_counter() - start
            total = checksum(model)
            reference = total if reference is None else reference
            out.append({"path": reader.name, "seconds": round(seconds, 3),
                        "gb_per_s": round(reader.bytes_read / seconds / 1e9, 3), "same_weights": total == reference})
    del model
    if dev.type == "cuda":
        torch.cuda.empty_cache()  # the fresh processes' memory
    return out


def one(ckpt: Path, reader: str, beside: str) -> dict:
    """One load in this fresh process, as the engine does it (fill_from_checkpoint), `beside` the tokenizer load:
    alone, on a plain thread (5 ms GIL switches), or on railyard's Background (short switches)."""
    os.environ[READER_ENV] = reader
    model, dev = built(ckpt)
    tokenizer_s: list[float] = []
    job = None
    if beside != "alone":
        from railyard.engine.startup.background import Background
        from railyard.engine.tokenizer import load_tokenizer

        def load() -> None:
            start = time.perf_counter()
            load_tokenizer(str(ckpt))
            tokenizer_s.append(time.perf_counter() - start)

        if beside == "thread":
            job = threading.Thread(target=load, daemon=True)
            job.start()
        else:
            job = Background(load)
    switch = sys.getswitchinterval()
    start = time.perf_counter()
    load = fill_from_checkpoint(model, ckpt)
    sync(dev)
    seconds = time.perf_counter() - start
    waited = time.perf_counter()
    if job is not None:
        job.join() if isinstance(job, threading.Thread) else job.result()
    waited = time.perf_counter() - waited
    return {"reader": load.reader, "beside": beside, "seconds": round(seconds, 3),
            "gb_per_s": round(load.bytes / seconds / 1e9, 3), "read_s": round(load.read_s, 3),
            "to_device_s": round(load.to_device_s, 3), "copy_s": round(load.copy_s, 3),
            "switch_interval_s": switch, "tokenizer_s": round(tokenizer_s[0], 3) if tokenizer_s else None,
            "tokenizer_left_after_s": round(waited, 3), "checksum": checksum(model)}


def fresh(ckpt: Path, reader: str, beside: str) -> dict:
    cmd = [sys.executable, __file__, str(ckpt), "--one", reader, beside]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=ONE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"reader": reader, "beside": beside, "error": f"timed out after {ONE_TIMEOUT_S} s"}
    if done.returncode != 0:
        return {"reader": reader, "beside": beside, "error": done.stderr[-600:]}
    result = json.loads(done.stdout)
    print(f"{reader:6s} {beside:10s} {result['gb_per_s']} GB/s ({result['seconds']} s; tokenizer "
          f"{result['tokenizer_s']} s)", file=sys.stderr, flush=True)
    return result


def main() -> None:
    ckpt = Path(sys.argv[1])
    if len(sys.argv) > 2 and sys.argv[2] == "--one":
        print(json.dumps(one(ckpt, sys.argv[3], sys.argv[4])))
        return
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    output = Path(sys.argv[3]) if len(sys.argv) > 3 else None
    files = checkpoint_files(ckpt)
    report = {"pre_read": read_through(files), "resident": resident_fraction(files), "fresh": []}

    def save() -> None:  # what a timeout leaves is kept
        if output is not None:
            output.write_text(json.dumps(report, indent=1))

    report["runs"] = rounds(ckpt, repeats)  # (key kept: cold-start.sh's summary reads it)
    save()
    print("rounds:", "; ".join(f"{r['path']} {r['gb_per_s']} GB/s" for r in report["runs"]), file=sys.stderr, flush=True)
    for beside in ("alone", "thread", "background"):
        for reader in ("mapped", "staged"):
            report["fresh"].append(fresh(ckpt, reader, beside))
            save()
    if os.environ.get("DROP", "1") == "1":
        report["disk"] = []
        for reader in ("mapped", "staged"):
            drop_from_page_cache(files)
            resident = resident_fraction(files)
            report["disk"].append({**fresh(ckpt, reader, "alone"), "resident_before": resident})
            save()
        report["resident_after"] = resident_fraction(files)
        save()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
