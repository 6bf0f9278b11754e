"""Train a byte-level BPE tokenizer of a real model's size on the Python sources of this machine, for GPU
benchmarks of named shapes: the embedded 259-token tokenizer makes grammar compiles and token masks far cheaper
than a real 150k vocabulary does (no weights or tokenizers can be downloaded there).

Usage: python3 scripts/bench/bpe_tokenizer.py OUT_DIR [--vocab-size 150000] [--max-mb 40]
Writes OUT_DIR/tokenizer.json and tokenizer_config.json (the embedded model's ChatML template, <|im_end|> as EOS).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import sysconfig
import time
from pathlib import Path

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])

from railyard.engine.startup.tiny_model import SPECIAL_TOKENS, _tokenizer_config  # noqa: E402


def sources(max_bytes: int) -> list[str]:
    """Python files of the standard library and site-packages, up to max_bytes, in a stable order."""
    roots = sorted({sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]})
    files, total = [], 0
    for root in roots:
        for path in sorted(Path(root).rglob("*.py")):
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if total + size > max_bytes:
                return files
            files.append(str(path))
            total += size
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--vocab-size", type=int, default=150_000)
    parser.add_argument("--max-mb", type=float, default=40.0)
    args = parser.parse_args()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    files = sources(int(args.max_mb * 2**20))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=args.vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    start = time.perf_counter()
    tok.train_from_iterator((Path(f).read_text(encoding="utf-8", errors="ignore") for f in files), trainer)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {**_tokenizer_config(), "model_max_length": 131072}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    print(json.dumps({"files": len(files), "mb": round(sum(os.path.getsize(f) for f in files) / 2**20, 1),
                      "vocab_size": tok.get_vocab_size(), "train_s": round(time.perf_counter() - start, 1),
                      "dir": str(out)}))


if __name__ == "__main__":
    main()
