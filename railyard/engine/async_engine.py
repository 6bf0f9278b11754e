"""`AsyncEngine`: the Engine's step loop in a background thread; each request is an async stream.

Every touch of the Engine (add, abort, step, invariant checks) happens on one worker thread, between
steps, so the synchronous Engine needs no locks and the event loop (HTTP, SSE) never waits on a
forward pass. A stream that is cancelled (the client left) aborts its request, which frees its KV
blocks before the next step runs.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from railyard.engine.config import EngineConfig, SamplingParams
from railyard.engine.engine import Engine
from railyard.engine.outputs import EngineStats, RequestOutput
from railyard.errors import ConfigError, EngineDeadError, EngineOverloadedError, InvalidRequestError

log = logging.getLogger("railyard.engine")


class StepListener(Protocol):
    """Told about every step's outputs (metrics); called on the event loop, must be quick."""

    def on_step(self, outputs: list[RequestOutput], stats: EngineStats, now: float) -> None: ...

    def on_abort(self, request_id: str) -> None: ...


class RequestStream:
    """The outputs of one request. Outputs are cumulative, so a slow reader skips straight to the latest."""

    def __init__(self, request_id: str, engine: "AsyncEngine") -> None:
        self.request_id = request_id
        self._engine = engine
        self._latest: RequestOutput | None = None
        self._error: BaseException | None = None
        self._ready = asyncio.Event()
        self.finished = False

    def _put(self, output: RequestOutput) -> None:
        self._latest = output
        self._ready.set()

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._ready.set()

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[RequestOutput]:
        try:
            while not self.finished:
                await self._ready.wait()
                self._ready.clear()
                if self._latest is not None:
                    out, self._latest = self._latest, None
                    self.finished = out.finished
                    yield out
                elif self._error is not None:
                    raise self._error
        finally:
            if not self.finished:  # cancelled, closed early or failed: free the request's blocks now
                self.abort()

    def abort(self) -> None:
        """Stop the request (idempotent); its KV blocks are freed before the engine's next step."""
        if not self.finished:
            self.finished = True
            self._engine.abort(self.request_id)


class AsyncEngine:
    """Wraps an `Engine` for asyncio servers: start(), add_request() -> RequestStream, abort(), stats."""

    def __init__(self, engine: Engine, *, max_waiting_requests: int = 1024, retry_after_s: int = 1,
                 listener: StepListener | None = None) -> None:
        if max_waiting_requests < 1:
            raise ConfigError(f"max_waiting_requests must be at least 1, got {max_waiting_requests}")
        self.engine = engine
        self.max_waiting_requests = max_waiting_requests
        self.retry_after_s = retry_after_s
        self.listener = listener
        self.stats: EngineStats = engine.stats()
        self._streams: dict[str, RequestStream] = {}
        self._ops: list[tuple[Callable[[], Any], asyncio.Future | None]] = []
        self._in_flight: list[tuple[Callable[[], Any], asyncio.Future | None]] = []  # the running turn's ops
        self._num_pending_adds = 0
        self._has_work = False
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="railyard-engine")
        self.loop: asyncio.AbstractEventLoop | None = None
        self.dead: EngineDeadError | None = None
        self._closed = False

    @classmethod
    def from_config(cls, config: EngineConfig, **kwargs) -> "AsyncEngine":
        return cls(Engine(config), **kwargs)

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the step loop on the running event loop (idempotent)."""
        if self._task is None:
            self.loop = asyncio.get_running_loop()  # other threads submit coroutines here
            self._wakeup = asyncio.Event()
            self._task = self.loop.create_task(self._loop(), name="railyard-engine-loop")

    async def shutdown(self) -> None:
        """Stop the loop after the step in flight; open streams end with EngineDeadError (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._fail_all(self.dead or EngineDeadError("the engine was shut down"))
        await asyncio.get_running_loop().run_in_executor(self._thread, self.engine.shutdown)
        self._thread.shutdown(wait=True)

    @property
    def is_running(self) -> bool:
        return self._task is not None and not self._task.done() and self.dead is None

    # -- requests --------------------------------------------------------------------------------
    @property
    def num_pending(self) -> int:
        """Requests not finished: queued for the engine, waiting, running or swapped (what routers balance)."""
        return self._num_pending_adds + self.stats.num_pending

    @property
    def num_waiting(self) -> int:
        """Requests accepted but not yet admitted to the running batch (as of the last step)."""
        return self._num_pending_adds + self.stats.num_waiting

    async def add_request(self, request_id: str, prompt: str | None, params: SamplingParams, *,
                          prompt_token_ids: list[int] | None = None, arrival_time: float | None = None,
                          priority: int = 0) -> RequestStream:
        """Queue a request; returns its stream once the engine accepted it.

        Raises InvalidRequestError (refused alone), EngineOverloadedError (too many waiting) or EngineDeadError.
        """
        self._check_alive()
        if self.num_waiting >= self.max_waiting_requests:
            raise EngineOverloadedError(
                f"{self.num_waiting} requests are already waiting (limit {self.max_waiting_requests}); retry later",
                self.retry_after_s)
        if request_id in self._streams:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        arrival = arrival_time if arrival_time is not None else time.monotonic()
        stream = RequestStream(request_id, self)
        self._streams[request_id] = stream
        self._num_pending_adds += 1
        try:
            await self._run_op(lambda: self.engine.add_request(
                request_id, prompt, params, prompt_token_ids=prompt_token_ids, arrival_time=arrival,
                priority=priority))
        except BaseException:
            # Refused, or the caller was cancelled while waiting: nothing of it may stay behind.
            self._streams.pop(request_id, None)
            self.abort(request_id)
            raise
        finally:
            self._num_pending_adds -= 1
        return stream

    async def generate(self, request_id: str, prompt: str | None, params: SamplingParams,
                       **kwargs) -> AsyncIterator[RequestOutput]:
        """Convenience: add a request and yield its outputs until it finishes."""
        stream = await self.add_request(request_id, prompt, params, **kwargs)
        async for out in stream:
            yield out

    def abort(self, request_id: str) -> None:
        """Abort a request in any state; callable from any coroutine without awaiting."""
        self._streams.pop(request_id, None)
        if self.listener is not None:
            self.listener.on_abort(request_id)
        if self.dead is None and self._wakeup is not None:
            self._ops.append((lambda: self.engine.abort(request_id), None))
            self._wakeup.set()

    async def run_between_steps(self, fn: Callable[[], Any]) -> Any:
        """Run fn on the engine thread while no step is in flight (e.g. Engine.check_invariants)."""
        self._check_alive()
        return await self._run_op(fn)

    # -- the loop --------------------------------------------------------------------------------
    def _check_alive(self) -> None:
        if self.dead is not None:
            raise self.dead
        if self._task is None:
            raise EngineDeadError("the engine loop is not started; call AsyncEngine.start() first")

    async def _run_op(self, fn: Callable[[], Any]) -> Any:
        future = asyncio.get_running_loop().create_future()
        self._ops.append((fn, future))
        self._wakeup.set()
        return await future

    def _turn(self, ops: list[tuple[Callable[[], Any], asyncio.Future | None]]):
        """On the engine thread: apply queued operations, then run one step if there is work."""
        results = []
        for fn, future in ops:
            try:
                results.append((future, True, fn()))
            except Exception as exc:  # an op's failure belongs to its caller alone
                results.append((future, False, exc))
        outputs = self.engine.step() if self.engine.has_unfinished_requests() else []
        for out in outputs:
            # The engine keeps updating a request's metrics in the next step, which runs while these
            # outputs are handed out: give the event loop a snapshot.
            out.metrics = copy.copy(out.metrics)
        return results, outputs, self.engine.stats(), self.engine.has_unfinished_requests()

    def _submit_turn(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future:
        self._in_flight, self._ops = self._ops, []
        return loop.run_in_executor(self._thread, self._turn, self._in_flight)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        turn: asyncio.Future | None = None
        try:
            while True:
                if turn is None:
                    if not self._ops and not self._has_work:
                        self._wakeup.clear()
                        await self._wakeup.wait()
                    turn = self._submit_turn(loop)
                results, outputs, self.stats, self._has_work = await turn
                # The next step starts before these outputs are handed out (SSE writes, metrics), so the
                # engine does not sit idle while the event loop works; ops queued meanwhile join the one after.
                turn = self._submit_turn(loop) if self._has_work or self._ops else None
                self._deliver(results, outputs)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            log.exception("the engine loop died")
            self.dead = EngineDeadError(f"the engine loop died: {type(exc).__name__}: {exc}")
            self._fail_all(self.dead)

    def _deliver(self, results, outputs: list[RequestOutput]) -> None:
        for future, ok, value in results:
            if future is None:
                if not ok:
                    log.warning("engine operation failed: %s", value)
            elif not future.done():  # a caller cancelled while waiting leaves a done future
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is not None:
                if out.finished:
                    del self._streams[out.request_id]
                stream._put(out)
        if self.listener is not None:
            self.listener.on_step(outputs, self.stats, time.monotonic())

    def _fail_all(self, error: EngineDeadError) -> None:
        # Operations of the turn that died are failed too: their callers must not wait forever.
        for fn, future in self._in_flight + self._ops:
            if future is not None and not future.done():
                future.set_exception(error)
        self._in_flight, self._ops = [], []
        for stream in self._streams.values():
            stream._fail(error)
        self._streams.clear()
