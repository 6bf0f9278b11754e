"""`railyard generate`: offline generation from the command line."""

from __future__ import annotations

import argparse
import json
import sys

from railyard.engine.args import add_engine_args, engine_config_from_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text offline for one or more prompts")
    p.add_argument("--prompt", action="append", help="a prompt (repeat for a batch) (default: one per line of stdin)")
    p.add_argument("--max-tokens", type=int, default=32, help="most tokens to generate per output")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: keep the smallest set of tokens "
                                                             "with this much probability (1: all)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k likeliest tokens (0: all)")
    p.add_argument("--min-p", type=float, default=0.0, help="drop tokens below this fraction of the likeliest "
                                                             "token's probability (0: none)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed, for repeatable samples (default: none: "
                                                          "a fresh random stream)")
    p.add_argument("--n", type=int, default=1, help="outputs per prompt")
    p.add_argument("--stop", action="append", default=[], help="a stop string (repeat for several)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")
    p.add_argument("--json", action="store_true", help="print one JSON object per output")
    add_engine_args(p)
    p.set_defaults(func=run_generate)


def run_generate(args: argparse.Namespace) -> int:
    from railyard.engine.config import SamplingParams
    from railyard.engine.llm import LLM

    prompts = args.prompt or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not prompts:
        raise ValueError("no prompts: pass --prompt TEXT or pipe prompts on stdin, one per line")
    params = SamplingParams(n=args.n, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            min_p=args.min_p, seed=args.seed, max_tokens=args.max_tokens, stop=args.stop,
                            ignore_eos=args.ignore_eos)
    config = engine_config_from_args(args)
    llm = LLM(**vars(config))
    for out in llm.generate(prompts, params, use_tqdm=sys.stderr.isatty()):
        for c in out.outputs:
            if args.json:
                print(json.dumps({"prompt": out.prompt, "index": c.index, "text": c.text, "token_ids": c.token_ids,
                                  "finish_reason": c.finish_reason}))
            else:
                print(f"--- {out.prompt!r} [{c.index}] ({c.finish_reason}, {len(c.token_ids)} tokens)\n{c.text}")
    return 0
