"""The one interface between a front (the OpenAI API, a Ray Serve replica) and an engine.

`EngineClient` is what fronts use: add a request and read its outputs as an async stream, abort it,
read the engine's stats, health and model limits, shut it down. Implementations:
- `EngineProcessClient` (railyard.engine.client.process): the engine core in its own process, so the
  step loop never shares a GIL with HTTP, SSE or tokenisation (the default for serving);
- `InProcessEngineClient` (railyard.engine.client.inproc): the core on a thread of this process
  (debugging, fast tests);
- `RayEngineClient` (railyard.serve.client): a model's Ray Serve replicas, each running one of the above.
The first two share `CoreClient`: validation at the door, output processing (text, stop strings), streams.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol, runtime_checkable

import msgspec

from railyard.engine.client.output_processor import OutputProcessor
from railyard.engine.config import SamplingParams
from railyard.engine.core.model_info import ModelInfo
from railyard.engine.core.validation import (
    check_priority,
    check_prompt_token_ids,
    check_sampling_params,
)
from railyard.engine.core.wire import RequestRefused, request_error
from railyard.engine.lora.request import LoRARequest
from railyard.engine.outputs import EngineStats, RequestOutput, SeqDelta
from railyard.engine.tokenizer import encode_prompt
from railyard.errors import (
    ConfigError,
    EngineDeadError,
    EngineOverloadedError,
    InvalidRequestError,
    UnknownLoRAError,
)

log = logging.getLogger("railyard.engine")


def _ignore_stop(request_id: str, index: int, stop: str) -> None:
    """A dead engine has nothing left to stop."""


class StepListener(Protocol):
    """Told about every batch of outputs (metrics); called on the event loop, must be quick."""

    def on_step(self, outputs: list[RequestOutput], stats: EngineStats, now: float) -> None:
        """outputs: one per request that advanced (final_only requests too, with no choices until they finish)."""

    def on_abort(self, request_id: str) -> None: ...


@runtime_checkable
class EngineClient(Protocol):
    """What a front may ask of an engine; nothing else of the engine is visible to it."""

    model_info: ModelInfo
    tokenizer: object | None  # the front's own tokenizer (None: the engine takes token ids only)
    stats: EngineStats  # the engine's latest reported stats
    dead: EngineDeadError | None  # why the engine stopped, once it has
    listener: StepListener | None

    async def start(self) -> None: ...

    async def add_request(self, request_id: str, prompt: str | None, params: SamplingParams, *,
                          prompt_token_ids: list[int], arrival_time: float | None = None,
                          priority: int = 0, lora: LoRARequest | None = None) -> AsyncIterator[RequestOutput]:
        """lora: one of model_info.loras (UnknownLoRAError, the front's 404, for a name not loaded), or None:
        the base model."""

    def abort(self, request_id: str) -> None: ...

    async def load_lora(self, request: LoRARequest) -> None:
        """Load a LoRA adapter between steps; InvalidRequestError (400) for one that does not fit this model or
        these limits, and nothing running is disturbed. model_info.loras lists it after."""

    async def unload_lora(self, lora_name: str) -> None:
        """Stop serving an adapter (requests running with it finish); UnknownLoRAError (404) if none has that
        name."""

    async def list_loras(self) -> list[LoRARequest]:
        """The adapters the engine serves now (model_info.loras, refreshed)."""

    @property
    def is_running(self) -> bool: ...

    @property
    def num_pending(self) -> int: ...

    async def shutdown(self) -> None: ...


class RequestStream:
    """One request's outputs, as an async iterator. Delta outputs that arrive while the reader is busy
    are merged into one (so a slow reader gets fewer, larger chunks, never a backlog); cumulative ones
    replace each other.

    With a stream interval (the client's `stream_interval()`, read before each hold), the first output is handed
    over at once and later ones at most once per interval (what arrives meanwhile merges), the final output or an
    error at once: a hop that costs per item (a Ray stream, vLLM's --stream-interval, Ray Serve LLM's stream
    batching) carries several tokens per item instead of one, while TTFT and the end of the request are not
    delayed."""

    def __init__(self, request_id: str, client: CoreClient, merge_deltas: bool) -> None:
        self.request_id = request_id
        self._client = client
        self._merge = merge_deltas
        self._latest: RequestOutput | None = None
        self._error: BaseException | None = None
        self._ready = asyncio.Event()
        self._urgent = asyncio.Event()  # the final output or an error is waiting: no holding back
        self.finished = False

    def _put(self, output: RequestOutput) -> None:
        if self._merge and self._latest is not None:
            self._latest.merge(output)
        else:
            self._latest = output
        self._ready.set()
        if output.finished:
            self._urgent.set()

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._ready.set()
        self._urgent.set()

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[RequestOutput]:
        last_yield: float | None = None
        try:
            while not self.finished:
                await self._ready.wait()
                if last_yield is not None:
                    interval_s = self._client.stream_interval()
                    if interval_s > 0:
                        await self._hold_until(last_yield + interval_s)
                self._ready.clear()
                if self._latest is not None:
                    out, self._latest = self._latest, None
                    self.finished = out.finished
                    yield out
                    last_yield = time.monotonic()
                elif self._error is not None:
                    raise self._error
        finally:
            if not self.finished:  # cancelled, closed early or failed: free the request's blocks now
                self.abort()

    async def _hold_until(self, deadline: float) -> None:
        """Let outputs merge until `deadline`, unless the final output or an error arrives first."""
        wait = deadline - time.monotonic()
        if wait > 0 and not self._urgent.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._urgent.wait()

    def abort(self) -> None:
        """Stop the request (idempotent); its KV blocks are freed before the engine's next step."""
        if not self.finished:
            self.finished = True
            self._client.abort(self.request_id)


# Requests allowed to wait for a batch slot before new ones get 503 + Retry-After (`railyard serve`'s
# --max-waiting-requests and a serve replica's default).
DEFAULT_MAX_WAITING_REQUESTS = 1024


class CoreClient(abc.ABC):
    """An EngineClient over an EngineCore: checks at the door, output processing and streams here;
    subclasses carry requests to the core and its deltas back (a thread, or a process)."""

    def __init__(self, model_info: ModelInfo, tokenizer, *, max_waiting_requests: int = DEFAULT_MAX_WAITING_REQUESTS,
                 retry_after_s: int = 1, listener: StepListener | None = None, stream_interval_s: float = 0.0,
                 stream_items_per_s: float = 0.0) -> None:
        """stream_interval_s: the least time between two outputs of one stream (see RequestStream); 0: every step.
        stream_items_per_s: with many streams, the interval grows so that all streams together yield about this
        many outputs per second (see stream_interval); 0: no such budget."""
        if max_waiting_requests < 1:
            raise ConfigError(f"max_waiting_requests must be at least 1, got {max_waiting_requests}")
        if stream_interval_s < 0:
            raise ConfigError(f"stream_interval_s must be >= 0, got {stream_interval_s}")
        if stream_items_per_s < 0:
            raise ConfigError(f"stream_items_per_s must be >= 0, got {stream_items_per_s}")
        self.stream_interval_s = stream_interval_s
        self.stream_items_per_s = stream_items_per_s
        self.model_info = model_info
        self.tokenizer = tokenizer
        self.max_waiting_requests = max_waiting_requests
        self.retry_after_s = retry_after_s
        self.listener = listener
        self.stats = EngineStats()
        self.dead: EngineDeadError | None = None
        self.processor = OutputProcessor(tokenizer)
        self._streams: dict[str, RequestStream] = {}
        self._num_sent = 0  # add requests sent to the core (its stats count those it took)
        self._num_refused = 0
        self.loop: asyncio.AbstractEventLoop | None = None

    # -- lifecycle (subclasses) ------------------------------------------------------------------
    @abc.abstractmethod
    async def start(self) -> None:
        """Start delivering outputs on the running event loop (idempotent)."""

    @abc.abstractmethod
    async def shutdown(self) -> None:
        """Stop the engine; open streams end with EngineDeadError (idempotent)."""

    @property
    @abc.abstractmethod
    def is_running(self) -> bool:
        """The engine is up and its loop alive (what /health reports)."""

    @abc.abstractmethod
    def _send_add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, arrival_time: float,
                  priority: int, lora: LoRARequest | None = None) -> None: ...

    @abc.abstractmethod
    def _send_abort(self, request_id: str) -> None: ...

    @abc.abstractmethod
    def _send_stop(self, request_id: str, index: int, stop: str) -> None: ...

    @abc.abstractmethod
    async def _call(self, method: str, *args: Any) -> Any:
        """Run one of UTILITY_METHODS on the core between steps and return its result."""

    # -- requests --------------------------------------------------------------------------------
    def stream_interval(self) -> float:
        """The least time between two outputs of one stream, now: stream_interval_s, or live streams /
        stream_items_per_s when that is longer. Each output a stream yields costs the hops after it per item
        (a Ray stream item through the ingress and the proxy, ray #52745), so the outputs of all streams
        together stay near the budget however many streams are live: more tokens per item, not more items."""
        if not self.stream_items_per_s:
            return self.stream_interval_s
        return max(self.stream_interval_s, len(self._streams) / self.stream_items_per_s)

    @property
    def num_waiting(self) -> int:
        """Requests accepted but not yet admitted to the running batch: in transit to the core, or waiting there."""
        in_transit = self._num_sent - self._num_refused - self.stats.num_requests_added_total
        return max(0, in_transit) + self.stats.num_waiting

    @property
    def num_pending(self) -> int:
        """Requests not finished: in transit, waiting, running or swapped (what routers balance)."""
        return self.num_waiting + self.stats.num_running + self.stats.num_swapped

    async def add_request(self, request_id: str, prompt: str | None, params: SamplingParams, *,
                          prompt_token_ids: list[int] | None = None, arrival_time: float | None = None,
                          priority: int = 0, lora: LoRARequest | None = None) -> RequestStream:
        """Check a request at the door and send it to the engine; returns its stream at once. lora: a loaded
        adapter (model_info.loras) to run it with; None: the base model.

        Raises InvalidRequestError (refused alone), UnknownLoRAError (an adapter not loaded), EngineOverloadedError
        (too many waiting) or EngineDeadError.
        """
        self._check_alive()
        if lora is not None:
            self._check_lora(lora)
        if self.num_waiting >= self.max_waiting_requests:
            raise EngineOverloadedError(
                f"{self.num_waiting} requests are already waiting (limit {self.max_waiting_requests}); retry later",
                self.retry_after_s)
        if request_id in self._streams or self.processor.has(request_id):
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        if prompt_token_ids is None:  # tokenized off the event loop
            prompt, ids = await asyncio.to_thread(encode_prompt, self.tokenizer, prompt)
        else:
            ids = list(prompt_token_ids)
        info = self.model_info
        check_prompt_token_ids(ids, vocab_size=info.vocab_size, max_model_len=info.max_model_len)
        check_sampling_params(params, vocab_size=info.vocab_size)
        check_priority(priority, info.scheduling_policy)
        arrival = arrival_time if arrival_time is not None else time.monotonic()
        stream = RequestStream(request_id, self, merge_deltas=params.output_kind == "delta")
        self._streams[request_id] = stream
        self.processor.add_request(request_id, prompt, ids, params, arrival)
        self._num_sent += 1
        self._send_add(request_id, ids, params, arrival, priority, lora)
        return stream

    # -- LoRA adapters (run between steps) -------------------------------------------------------
    async def load_lora(self, request: LoRARequest) -> None:
        """Load an adapter (EngineCore.load_lora); InvalidRequestError for a bad one, which changes nothing."""
        await self._checked_call("load_lora", request)
        self.model_info.loras = [*self.model_info.loras, request]

    async def unload_lora(self, lora_name: str) -> None:
        """Unload an adapter by name (EngineCore.unload_lora); UnknownLoRAError if none has that name."""
        await self._checked_call("unload_lora", lora_name)
        self.model_info.loras = [r for r in self.model_info.loras if r.lora_name != lora_name]

    async def list_loras(self) -> list[LoRARequest]:
        """The adapters the engine serves now; refreshes model_info.loras."""
        value = await self._checked_call("list_loras")
        self.model_info.loras = msgspec.convert(value, list[LoRARequest])
        return list(self.model_info.loras)

    def lora_request(self, lora_name: str) -> LoRARequest:
        """The loaded adapter of that name (what a request's `model` names); UnknownLoRAError if there is none."""
        found = next((r for r in self.model_info.loras if r.lora_name == lora_name), None)
        if found is None:
            raise UnknownLoRAError(f"no LoRA adapter named {lora_name!r} is loaded")
        return found

    def _check_lora(self, lora: LoRARequest) -> None:
        if not self.model_info.max_loras:
            raise InvalidRequestError("this engine serves no LoRA adapters (start it with --enable-lora)")
        if self.lora_request(lora.lora_name) != lora:
            raise InvalidRequestError(f"LoRA adapter {lora.lora_name!r} is loaded as "
                                      f"{self.lora_request(lora.lora_name)}, not {lora}")

    async def generate(self, request_id: str, prompt: str | None, params: SamplingParams,
                       **kwargs) -> AsyncIterator[RequestOutput]:
        """Convenience: add a request and yield its outputs until it finishes."""
        stream = await self.add_request(request_id, prompt, params, **kwargs)
        async for out in stream:
            yield out

    def abort(self, request_id: str) -> None:
        """Abort a request in any state; callable from any coroutine without awaiting."""
        self._streams.pop(request_id, None)
        if not self.processor.has(request_id):
            return  # finished or unknown: nothing to free
        self.processor.abort(request_id)
        if self.listener is not None:
            self.listener.on_abort(request_id)
        if self.dead is None:
            self._send_abort(request_id)

    # -- sleep mode (EngineCore.sleep; run between steps) ----------------------------------------
    async def sleep(self, level: int = 1) -> None:
        """Put the engine to sleep (InvalidRequestError: sleep mode is off, a bad level, or requests are running or
        waiting). Requests sent while it sleeps wait for wake_up, as vLLM's paused engine holds them."""
        await self._checked_call("sleep", level)
        self.stats.sleep_level = level

    async def wake_up(self, tags: list[str] | None = None) -> dict | None:
        """Wake the engine (tags: "weights", "kv_cache"; None: both); returns where the wake-up's time went."""
        return await self._checked_call("wake_up", tags)

    async def is_sleeping(self) -> bool:
        return bool(await self._checked_call("is_sleeping"))

    async def device_memory(self) -> dict[str, int]:
        """Bytes the engine holds now: weights and KV cache on its device, the weights' host copy while asleep."""
        return dict(await self._checked_call("device_memory"))

    # -- debugging and routing helpers (run between steps) ---------------------------------------
    async def check_invariants(self) -> None:
        """Raise AssertionError if the engine's KV bookkeeping is inconsistent (tests, debugging)."""
        await self._checked_call("check_invariants")

    async def cached_block_hashes(self) -> set[int]:
        """The prefix-cache block hashes the engine holds (the router's prefix affinity)."""
        return set(await self._checked_call("cached_block_hashes"))

    async def _checked_call(self, method: str, *args: Any) -> Any:
        self._check_alive()
        return await self._call(method, *args)

    # -- from the core ---------------------------------------------------------------------------
    def _on_step(self, deltas: list[SeqDelta], stats: EngineStats, refused: list[RequestRefused]) -> None:
        """Process one step's deltas on the event loop and hand each request its output."""
        self.stats = stats
        now = time.monotonic()
        for r in refused:  # the core refused what the door let through: that request alone fails
            self._num_refused += 1
            self.processor.abort(r.request_id)
            stream = self._streams.pop(r.request_id, None)
            if stream is not None:
                stream._fail(request_error(r.kind, r.message) or InvalidRequestError(r.message))
        if not deltas:
            return
        processed = self.processor.process_step(deltas, now, self._send_stop if self.dead is None else _ignore_stop)
        for out in processed.outputs:
            stream = self._streams.get(out.request_id)
            if stream is not None:
                if out.finished:
                    del self._streams[out.request_id]
                stream._put(out)
        if self.listener is not None:
            self.listener.on_step(processed.progress, stats, now)

    def _die(self, error: EngineDeadError, *, quiet: bool = False) -> None:
        """The engine is gone: every open stream and every later request fails with `error`."""
        if self.dead is None:
            self.dead = error
            if not quiet:
                log.error("%s", error)
        for stream in self._streams.values():
            stream._fail(self.dead)
        self._streams.clear()
        self.processor = OutputProcessor(self.tokenizer)

    def _check_alive(self) -> None:
        if self.dead is not None:
            raise self.dead
        if self.loop is None:
            raise EngineDeadError("the engine client is not started; call start() first")
