"""`InProcessEngineClient`: the engine core on a worker thread of this process (`--no-engine-process`).

For debugging and fast tests. Every touch of the core (add, abort, step, utilities) happens on one
worker thread between steps, so the core needs no locks; the event loop processes the deltas. It shares
the GIL with the front, which is why serving uses the engine process instead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from railyard.engine.client.base import CoreClient
from railyard.engine.config import EngineConfig, SamplingParams
from railyard.engine.core.engine_core import EngineCore
from railyard.engine.core.wire import UTILITY_METHODS
from railyard.engine.lora.request import LoRARequest
from railyard.errors import EngineDeadError

log = logging.getLogger("railyard.engine")

_Op = tuple[Callable[[], Any], asyncio.Future | None]


class InProcessEngineClient(CoreClient):
    """An EngineClient whose core steps on a background thread of this process."""

    def __init__(self, core: EngineCore, **kwargs) -> None:
        super().__init__(core.model_info(), core.tokenizer, **kwargs)
        self.core = core
        self.stats = core.stats()
        self._ops: list[_Op] = []
        self._in_flight: list[_Op] = []  # the running turn's ops
        self._has_work = False
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="railyard-engine")
        self._closed = False

    @classmethod
    def from_config(cls, config: EngineConfig, **kwargs) -> "InProcessEngineClient":
        return cls(EngineCore.from_config(config), **kwargs)

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is None:
            self.loop = asyncio.get_running_loop()
            self._wakeup = asyncio.Event()
            self._task = self.loop.create_task(self._loop(), name="railyard-engine-loop")

    async def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._fail_ops(self.dead or EngineDeadError("the engine was shut down"))
        self._die(self.dead or EngineDeadError("the engine was shut down"), quiet=True)
        await asyncio.get_running_loop().run_in_executor(self._thread, self.core.shutdown)
        self._thread.shutdown(wait=True)

    @property
    def is_running(self) -> bool:
        return self._task is not None and not self._task.done() and self.dead is None

    # -- to the core -----------------------------------------------------------------------------
    def _post(self, fn: Callable[[], Any], future: asyncio.Future | None = None) -> None:
        self._ops.append((fn, future))
        self._wakeup.set()

    def _send_add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, arrival_time: float,
                  priority: int, lora: LoRARequest | None = None) -> None:
        self._post(lambda: self.core.submit(request_id, prompt_token_ids, params, arrival_time=arrival_time,
                                            priority=priority, lora=lora))

    def _send_abort(self, request_id: str) -> None:
        self._post(lambda: self.core.abort(request_id))

    def _send_stop(self, request_id: str, index: int, stop: str) -> None:
        self._post(lambda: self.core.stop_sequence(request_id, index, stop))

    async def _call(self, method: str, *args: Any) -> Any:
        if method not in UTILITY_METHODS:
            raise ValueError(f"unknown engine utility {method!r}")
        future = asyncio.get_running_loop().create_future()
        self._post(lambda: getattr(self.core, method)(*args), future)
        return await future

    # -- the loop --------------------------------------------------------------------------------
    def _turn(self, ops: list[_Op]):
        """On the engine thread: apply queued operations, then run one step if there is work."""
        results = []
        for fn, future in ops:
            try:
                results.append((future, True, fn()))
            except Exception as exc:  # an op's failure belongs to its caller alone
                results.append((future, False, exc))
        deltas = self.core.step() if self.core.can_step() else []  # asleep (sleep mode): requests wait
        return results, deltas, self.core.take_refused(), self.core.stats(), self.core.can_step()

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
                results, deltas, refused, stats, self._has_work = await turn
                # The next step starts before these outputs are handed out (SSE writes, metrics), so the
                # engine does not sit idle while the event loop works; ops queued meanwhile join the one after.
                turn = self._submit_turn(loop) if self._has_work or self._ops else None
                self._resolve(results)
                self._on_step(deltas, stats, refused)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            log.exception("the engine loop died")
            error = EngineDeadError(f"the engine loop died: {type(exc).__name__}: {exc}")
            self._fail_ops(error)
            self._die(error)

    @staticmethod
    def _resolve(results) -> None:
        for future, ok, value in results:
            if future is None:
                if not ok:
                    log.warning("engine operation failed: %s", value)
            elif not future.done():  # a caller cancelled while waiting leaves a done future
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)

    def _fail_ops(self, error: EngineDeadError) -> None:
        # Operations of the turn that died are failed too: their callers must not wait forever.
        for _, future in self._in_flight + self._ops:
            if future is not None and not future.done():
                future.set_exception(error)
        self._in_flight, self._ops = [], []
