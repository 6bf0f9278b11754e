"""`Engine`: the synchronous engine in one thread (add_request / abort / step / stats).

An EngineCore (token ids in, per-step deltas out) plus the front's OutputProcessor (text, stop
strings), stepped by the caller: what the offline `LLM`, benchmarks and engine tests use. Servers use
an EngineClient instead (railyard.engine.client.base), which runs the core in its own process.
"""

from __future__ import annotations

import time

from railyard.engine.client.output_processor import OutputProcessor
from railyard.engine.config import EngineConfig, SamplingParams
from railyard.engine.core.engine_core import EngineCore
from railyard.engine.lora.request import LoRARequest
from railyard.engine.outputs import EngineStats, RequestOutput
from railyard.engine.tokenizer import encode_prompt


class Engine:
    """One replica's engine, stepped by its caller; delegates scheduling and execution to an EngineCore."""

    @classmethod
    def from_config(cls, config: EngineConfig) -> "Engine":
        """An engine for a checkpoint directory, or for a named shape with random weights (benchmarks)."""
        return cls(config, core=EngineCore.from_config(config))

    def __init__(self, config: EngineConfig, *, spec=None, executor=None, core: EngineCore | None = None) -> None:
        self.core = core or EngineCore(config, spec=spec, executor=executor)
        self.config = self.core.config
        self.tokenizer = self.core.tokenizer
        self.processor = OutputProcessor(self.tokenizer)

    # The core's parts, for callers and tests that look inside.
    @property
    def spec(self):
        return self.core.spec

    @property
    def scheduler(self):
        return self.core.scheduler

    @property
    def block_manager(self):
        return self.core.block_manager

    @property
    def executor(self):
        return self.core.executor

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.core.eos_token_ids

    @property
    def async_scheduling(self) -> bool:
        return self.core.async_scheduling

    # -- requests --------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int] | None, params: SamplingParams | None = None,
                    *, prompt_token_ids: list[int] | None = None, arrival_time: float | None = None,
                    priority: int = 0, lora_request: LoRARequest | None = None) -> None:
        """Queue a request (text or token ids), with a LoRA adapter (loaded first if it is not yet, as vLLM's
        offline engine does) or the base model; raises InvalidRequestError (and queues nothing) if it cannot be
        served."""
        params = params or SamplingParams()
        text, ids = encode_prompt(self.tokenizer, prompt, prompt_token_ids)
        now = arrival_time if arrival_time is not None else time.monotonic()
        if lora_request is not None and lora_request.lora_name not in self.core.loras:
            self.core.load_lora(lora_request)
        self.core.add_request(request_id, ids, params, arrival_time=now, priority=priority, lora=lora_request)
        self.processor.add_request(request_id, text, list(ids), params, now)

    def load_lora(self, request: LoRARequest) -> None:
        """Load a LoRA adapter (EngineCore.load_lora)."""
        self.core.load_lora(request)

    def unload_lora(self, lora_name: str) -> None:
        self.core.unload_lora(lora_name)

    def list_loras(self) -> list[LoRARequest]:
        return self.core.list_loras()

    def abort(self, request_id: str) -> bool:
        """Stop a request in any state and free its blocks at once; False if it is unknown or done."""
        self.processor.abort(request_id)
        return self.core.abort(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.core.has_unfinished_requests()

    @property
    def num_requests(self) -> int:
        return self.core.num_requests

    # -- the step --------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one batch (EngineCore.step); returns the requests that advanced, as their output kind asks."""
        processed = self.processor.process_step(self.core.step(), time.monotonic(), self.core.stop_sequence)
        refused = self.core.take_refused()  # a constraint failed to compile: say why
        if refused:
            why = {r.request_id: r.message for r in refused}
            for out in processed.outputs:
                out.error = why.get(out.request_id, out.error)
        return processed.outputs

    # -- sleep mode (EngineCore.sleep) -----------------------------------------------------------
    def sleep(self, level: int = 1) -> None:
        self.core.sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> dict | None:
        return self.core.wake_up(tags)

    def is_sleeping(self) -> bool:
        return self.core.is_sleeping()

    def device_memory(self) -> dict[str, int]:
        return self.core.device_memory()

    # -- introspection ---------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        return self.core.stats()

    def check_invariants(self) -> None:
        """Raise AssertionError if any KV block leaked or ref counts disagree with the live sequences."""
        self.core.check_invariants()

    def cached_block_hashes(self) -> set[int]:
        return self.core.cached_block_hashes()

    def check_health(self) -> None:
        self.core.check_health()

    def shutdown(self) -> None:
        self.core.shutdown()
