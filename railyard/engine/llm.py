"""`LLM`: offline batch generation (vLLM's offline API) with a progress bar."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence as Seq

from tqdm import tqdm

from railyard.engine.config import EngineConfig, SamplingParams
from railyard.engine.engine import Engine
from railyard.engine.lora.request import LoRARequest
from railyard.engine.outputs import RequestOutput
from railyard.errors import InvalidRequestError


class LLM:
    """Load a local checkpoint once, then `generate` for many prompts at a time."""

    def __init__(self, model: str = "", **engine_args) -> None:
        self.engine = Engine(EngineConfig(model=model, **engine_args))
        self._ids = itertools.count()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    # Sleep mode (vLLM's LLM.sleep / wake_up; the engine needs enable_sleep_mode=True).
    def sleep(self, level: int = 1) -> None:
        """Give the device memory of the KV cache, the CUDA graphs and the weights back (level 1: weights kept in
        host memory; level 2: read from the checkpoint again on wake-up)."""
        self.engine.sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Restore what sleep gave back (tags: "weights", "kv_cache"; None: both)."""
        self.engine.wake_up(tags)

    def is_sleeping(self) -> bool:
        return self.engine.is_sleeping()

    def generate(self, prompts: str | list[str] | list[int] | list[list[int]] | None = None,
                 sampling_params: SamplingParams | list[SamplingParams] | None = None, *,
                 prompt_token_ids: list[list[int]] | None = None, use_tqdm: bool = True,
                 priority: list[int] | None = None,
                 lora_request: LoRARequest | list[LoRARequest | None] | None = None) -> list[RequestOutput]:
        """Generate for every prompt (text or token ids); outputs come back in input order. lora_request: one LoRA
        adapter for every prompt, or one (or None: the base model) per prompt."""
        if self.engine.is_sleeping():
            raise InvalidRequestError("the engine is asleep: call wake_up() before generate()")
        items = _normalise(prompts, prompt_token_ids)
        params = (sampling_params if isinstance(sampling_params, list)
                  else [sampling_params or SamplingParams()] * len(items))
        if len(params) != len(items):
            raise InvalidRequestError(f"{len(params)} sampling params for {len(items)} prompts")
        loras = lora_request if isinstance(lora_request, list) else [lora_request] * len(items)
        if len(loras) != len(items):
            raise InvalidRequestError(f"{len(loras)} LoRA requests for {len(items)} prompts")
        # Offline callers see only finished requests: the engine need not build outputs every step.
        params = [dataclasses.replace(p, output_kind="final_only") for p in params]
        ids = [f"offline-{next(self._ids)}" for _ in items]
        added = []
        try:
            for i, (rid, item, p) in enumerate(zip(ids, items, params)):
                prio = priority[i] if priority else 0
                if isinstance(item, str):
                    self.engine.add_request(rid, item, p, priority=prio, lora_request=loras[i])
                else:
                    self.engine.add_request(rid, None, p, prompt_token_ids=item, priority=prio, lora_request=loras[i])
                added.append(rid)
        except Exception:
            for rid in added:  # all or nothing: a bad prompt leaves no half-submitted batch behind
                self.engine.abort(rid)
            raise
        finished: dict[str, RequestOutput] = {}
        with tqdm(total=len(items), desc="generate", unit="req", disable=not use_tqdm) as bar:
            while len(finished) < len(items):
                for out in self.engine.step():
                    if out.finished and out.request_id in ids:
                        finished[out.request_id] = out
                        bar.update(1)
        return [finished[rid] for rid in ids]


def _normalise(prompts, prompt_token_ids) -> list[str | list[int]]:
    if prompt_token_ids is not None:
        return [list(p) for p in prompt_token_ids]
    if prompts is None:
        raise InvalidRequestError("give prompts (text or token ids)")
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, Seq) and prompts and all(isinstance(t, int) for t in prompts):
        return [list(prompts)]
    out = []
    for p in prompts:
        if isinstance(p, dict) and "prompt_token_ids" in p:
            out.append(list(p["prompt_token_ids"]))
        elif isinstance(p, dict) and "prompt" in p:
            out.append(p["prompt"])
        else:
            out.append(p if isinstance(p, str) else list(p))
    return out
