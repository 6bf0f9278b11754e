"""`EngineProcessClient`: the engine core in its own process, the default for serving.

The front (this process: HTTP, tokenisation, detokenisation, SSE) never shares a GIL with the step
loop. Requests go to the core and per-step token deltas come back over two zmq sockets on a private
ipc:// directory, one msgpack frame per message (railyard.engine.core.wire). The process's sentinel is
watched on the event loop: a core that dies (killed, crashed) fails every open stream within moments
and /health turns 503. Start-up blocks until the core reports Ready, or raises its error (a model that
does not load, a KV cache that does not fit) as the same railyard error type, with its message.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import os
import select
import shutil
import signal
import tempfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from railyard.engine.startup.background import Background
from railyard.engine.client.base import CoreClient
from railyard.engine.config import EngineConfig, SamplingParams
from railyard.engine.core.process import run_engine_core
from railyard.engine.exits import EXITED_ELSEWHERE, describe_exit
from railyard.engine.lora.request import LoRARequest
from railyard.engine.tokenizer import load_token_ids_tokenizer, load_tokenizer
from railyard.engine.core.wire import (
    Abort, AddRequest, CoreFailed, Ready, Shutdown, StartupFailed, StepOutputs, StopSequence, UtilityCall,
    UtilityResult, encoder, from_core_decoder, request_error)
from railyard.errors import ConfigError, EngineDeadError, InvalidRequestError, ModelLoadError

log = logging.getLogger("railyard.engine")

DEFAULT_START_TIMEOUT_S = 1800.0  # loading a large checkpoint and capturing graphs can take minutes
_STOP_S = 10.0  # how long shutdown waits for the core to stop by itself before forcing it
_ERRORS_BY_KIND = {"ConfigError": ConfigError, "ModelLoadError": ModelLoadError}
_JOIN_CALL = -1  # the call id of a handed-over core's first question (call ids count from 0)
_WAKE_CALL = -2  # the call id of the wake-up a front that takes over a sleeping core asks for as it joins


@dataclass(frozen=True)
class CoreHandoff:
    """An engine core taken over by a new front (sleep mode's standby engines, serve/standby.py): its config, its
    process, the directory of its sockets' addresses and its Ready message (model facts and stats, encoded), or None
    for a core still starting (spawned by its owner for this front: the front waits for its Ready, as after a
    spawn of its own)."""

    config: EngineConfig
    pid: int
    directory: str
    ready: bytes | None = None


def spawn_core(config: EngineConfig, directory: str, standby: bool = False) -> multiprocessing.Process:
    """Start an engine core process that connects to the sockets a front binds in `directory` (now or later) and
    reports Ready there. standby: a core that can be handed from front to front (serve/standby.py)."""
    spawn = multiprocessing.get_context("spawn")  # CUDA cannot be forked
    # Not a daemon: the core spawns its own tensor-parallel workers, which a daemon process may not.
    process = spawn.Process(
        target=run_engine_core, name="railyard-engine-core",
        args=(config, f"ipc://{directory}/input", f"ipc://{directory}/output",
              logging.getLogger("railyard").getEffectiveLevel(),
              time.time(), standby))
    process.start()
    return process


class EngineProcessClient(CoreClient):
    """An EngineClient whose core runs in a spawned process; constructing it starts that process, or, given a
    handoff, takes over a core that is already running or that its owner started for it (the owner stays its
    parent)."""

    def __init__(self, config: EngineConfig, *, start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
                 handoff: CoreHandoff | None = None, standby: bool = False, wake_on_join: bool = False,
                 token_ids_only: bool = False, **kwargs) -> None:
        """standby: start a core that can be handed to other fronts (detach), for a pool of standby engines.
        wake_on_join: with a handoff, ask the core to wake up as soon as it has joined, so that its wake-up runs
        while this front waits for its tokenizer; the first `wake_up()` then returns that wake-up's times.
        token_ids_only: this front is sent token ids, never text (an engine replica behind railyard's ingress): its
        tokenizer only detokenizes (TokenIdsTokenizer where the files allow, without transformers)."""
        self._closed = False
        self._handoff = handoff
        self._wake_sent = False
        self._early_wake: asyncio.Future | None = None
        self._dir = handoff.directory if handoff is not None else tempfile.mkdtemp(prefix="railyard-engine-")
        self._ctx = zmq.Context()
        self._input = self._ctx.socket(zmq.PUSH)
        self._input.setsockopt(zmq.SNDHWM, 0)
        self._input.setsockopt(zmq.LINGER, 0)
        self._output = self._ctx.socket(zmq.PULL)
        self._output.setsockopt(zmq.RCVHWM, 0)
        self._input.bind(f"ipc://{self._dir}/input")
        self._output.bind(f"ipc://{self._dir}/output")
        self.process = spawn_core(config, self._dir, standby) if handoff is None else ForeignProcess(handoff.pid)
        # Never leave the core behind: also when this object is forgotten or the interpreter exits.
        self._finalizer = weakref.finalize(self, _stop_process, self.process, self._ctx, self._dir)
        prefetch = _TokenizerPrefetch(config, token_ids_only)  # loads while the core starts: off the critical path
        try:
            if handoff is None or handoff.ready is None:  # started for this front, by it or by its owner
                ready = self._wait_until_ready(start_timeout_s)
            else:
                self._wait_until_joined(start_timeout_s)
                if wake_on_join:
                    self._input.send(encoder.encode(UtilityCall(_WAKE_CALL, "wake_up", [None])), zmq.NOBLOCK)
                    self._wake_sent = True
                ready = from_core_decoder.decode(handoff.ready)
            info = ready.model_info
            started = time.perf_counter()
            tokenizer = prefetch.result(info.tokenizer)
            if info.startup is not None:
                info.startup.add("front_tokenizer", time.perf_counter() - started)
                if prefetch.seconds is not None:  # the front's load, in its own process beside the engine's start
                    info.startup.background["tokenizer"] = prefetch.seconds
        except BaseException:
            self._finalizer()
            raise
        super().__init__(info, tokenizer, **kwargs)
        self._config = config
        self.stats = ready.stats
        self._calls: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count()
        self._reader: asyncio.Task | None = None
        self._aoutput: zmq.asyncio.Socket | None = None
        log.info("engine core process %d ready", self.process.pid)

    @property
    def pid(self) -> int:
        return self.process.pid

    def _wait_until_joined(self, timeout_s: float) -> None:
        """A handed-over core reconnects to the addresses this front bound anew: ask it a question until it answers
        (with no peer yet the question finds no pipe), as a start waits for Ready, before the event loop reads."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._input.send(encoder.encode(UtilityCall(_JOIN_CALL, "is_sleeping")), zmq.NOBLOCK)
                break
            except zmq.Again:
                self._check_joining(deadline, timeout_s)
                time.sleep(0.005)
        while True:
            if self._output.poll(100):
                msg = from_core_decoder.decode(self._output.recv())
                if isinstance(msg, UtilityResult) and msg.call_id == _JOIN_CALL:
                    return
                continue
            self._check_joining(deadline, timeout_s)

    def _check_joining(self, deadline: float, timeout_s: float) -> None:
        if not self.process.is_alive():
            raise EngineDeadError(f"the engine core (pid {self.process.pid}) handed over to this front has exited")
        if time.monotonic() > deadline:
            raise EngineDeadError(f"the engine core (pid {self.process.pid}) did not reconnect within "
                                  f"{timeout_s:.0f} s")

    async def detach(self) -> CoreHandoff:
        """Let go of a sleeping core without stopping it (serve/standby.py hands it to the next front): the sockets
        close, the process runs on. Only a core this client started as a standby, or took over, can be handed on."""
        if not self.stats.sleep_level:
            raise InvalidRequestError("only a sleeping engine core can be handed over: sleep it first")
        config = self._handoff.config if self._handoff is not None else self._config
        ready = encoder.encode(Ready(self.model_info, self.stats))
        self._closed = True
        if self.loop is not None:
            self.loop.remove_reader(self.process.sentinel)
        await self._stop_reading()
        self._finalizer.detach()
        self._input.close(linger=0)
        # Closed once, through its owner: closing the asyncio shadow instead would leave the owner to close the same
        # handle again when it is collected, by then perhaps the handle of a next front's socket in this process.
        self._output.close(linger=0)
        self._ctx.term()
        return CoreHandoff(config, self.process.pid, self._dir, ready)

    async def _stop_reading(self) -> None:
        """End the task reading the core's outputs and take the output socket's descriptor off the event loop
        (zmq.asyncio registered it there): a socket this process opens next may be given the same descriptor, and a
        stale registration would take its wake-ups."""
        if self._reader is not None:
            self._reader.cancel()
            try:
                await self._reader
            except asyncio.CancelledError:
                pass
        if self._aoutput is not None and self.loop is not None and not self._output.closed:
            self.loop.remove_reader(self._aoutput.FD)

    def _wait_until_ready(self, timeout_s: float) -> Ready:
        deadline = time.monotonic() + timeout_s
        while True:
            if self._output.poll(100):
                msg = from_core_decoder.decode(self._output.recv())
                if isinstance(msg, Ready):
                    return msg
                if isinstance(msg, StartupFailed):
                    raise _ERRORS_BY_KIND.get(msg.kind, EngineDeadError)(msg.message)
                continue
            if not self.process.is_alive():
                raise EngineDeadError("the engine process exited while starting "
                                      f"({describe_exit(self.process.exitcode)}); "
                                      "its log above says why")
            if time.monotonic() > deadline:
                raise EngineDeadError(f"the engine process did not start within {timeout_s:.0f} s")

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.loop is not None:
            return
        self.loop = asyncio.get_running_loop()
        if self._wake_sent:  # its answer waits in the socket: the reader below delivers it here
            self._early_wake = self._calls[_WAKE_CALL] = self.loop.create_future()
        self._aoutput = zmq.asyncio.Socket.from_socket(self._output)
        self._reader = self.loop.create_task(self._read_outputs(), name="railyard-engine-outputs")
        self.loop.add_reader(self.process.sentinel, self._on_process_exit)

    async def shutdown(self) -> None:
        """Ask the core to stop, wait for it (then force it), and end every open stream."""
        if self._closed:
            return
        self._closed = True
        if self.loop is not None:
            self.loop.remove_reader(self.process.sentinel)
        if self.process.is_alive():
            try:
                self._input.send(encoder.encode(Shutdown()), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
            await asyncio.to_thread(self.process.join, _STOP_S)
        await self._stop_reading()
        self._die(self.dead or EngineDeadError("the engine was shut down"), quiet=True)
        self._fail_calls()
        self._finalizer()

    @property
    def is_running(self) -> bool:
        return (self.loop is not None and self.dead is None and not self._closed
                and self.process.exitcode is None)

    # -- to the core -----------------------------------------------------------------------------
    def _send(self, msg) -> None:
        self._input.send(encoder.encode(msg), zmq.NOBLOCK)

    def _send_add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, arrival_time: float,
                  priority: int, lora: LoRARequest | None = None) -> None:
        self._send(AddRequest(request_id, prompt_token_ids, params, arrival_time, priority, lora))

    def _send_abort(self, request_id: str) -> None:
        self._send(Abort([request_id]))

    def _send_stop(self, request_id: str, index: int, stop: str) -> None:
        self._send(StopSequence(request_id, index, stop))

    async def wake_up(self, tags: list[str] | None = None) -> dict | None:
        """As CoreClient's; the first call after a wake-on-join takeover waits for the wake-up already asked for."""
        if self._early_wake is not None and tags is None:
            early, self._early_wake = self._early_wake, None
            self._check_alive()
            return await early
        return await super().wake_up(tags)

    async def _call(self, method: str, *args: Any) -> Any:
        call_id = next(self._call_ids)
        future = self.loop.create_future()
        self._calls[call_id] = future
        self._send(UtilityCall(call_id, method, list(args)))
        return await future

    # -- from the core ---------------------------------------------------------------------------
    async def _read_outputs(self) -> None:
        try:
            while True:
                frame = await self._aoutput.recv(copy=False)
                self._handle(from_core_decoder.decode(frame.buffer))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug here would otherwise leave every stream waiting forever
            log.exception("processing the engine's outputs failed")
            self._die(EngineDeadError(f"processing the engine's outputs failed: {type(exc).__name__}: {exc}"))
            self._fail_calls()

    def _handle(self, msg) -> None:
        if isinstance(msg, StepOutputs):
            self._on_step(msg.deltas, msg.stats, msg.refused)
        elif isinstance(msg, UtilityResult):
            self._resolve(msg)
        elif isinstance(msg, CoreFailed):
            self._die(EngineDeadError(msg.message))
            self._fail_calls()

    def _resolve(self, result: UtilityResult) -> None:
        future = self._calls.pop(result.call_id, None)
        if future is None or future.done():
            return
        if result.ok:
            future.set_result(result.value)
        elif request_error(result.kind, result.error or "") is not None:  # the caller's request, not the engine
            future.set_exception(request_error(result.kind, result.error or ""))
        elif result.error and result.error.startswith("AssertionError"):
            future.set_exception(AssertionError(result.error))
        else:
            future.set_exception(EngineDeadError(f"engine call failed: {result.error}"))

    def _on_process_exit(self) -> None:
        self.loop.remove_reader(self.process.sentinel)
        if self._closed:
            return
        # What the core sent before it went (its last tokens, or why it failed) is delivered first.
        try:
            while self._output.poll(0):
                self._handle(from_core_decoder.decode(self._output.recv(zmq.NOBLOCK)))
        except zmq.ZMQError:
            pass
        self.process.join(1.0)
        self._die(EngineDeadError(f"the engine core process (pid {self.process.pid}) died "
                                  f"({describe_exit(self.process.exitcode)}); restart the server"))
        self._fail_calls()

    def _fail_calls(self) -> None:
        for future in self._calls.values():
            if not future.done():
                future.set_exception(self.dead or EngineDeadError("the engine was shut down"))
        self._calls.clear()


class ForeignProcess:
    """A process this one did not start (a handed-over engine core, serve/standby.py), watched through a pidfd:
    the parts of multiprocessing.Process a front uses. Its exit code goes to its parent, not here."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.sentinel = os.pidfd_open(pid)  # readable once the process has exited
        weakref.finalize(self, os.close, self.sentinel)

    @property
    def exitcode(self) -> int | None:
        return None if self.is_alive() else EXITED_ELSEWHERE

    def is_alive(self) -> bool:
        return not select.select([self.sentinel], [], [], 0)[0]

    def join(self, timeout: float | None = None) -> None:
        select.select([self.sentinel], [], [], timeout)

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, signum: int) -> None:
        try:
            signal.pidfd_send_signal(self.sentinel, signum)
        except ProcessLookupError:
            pass


class _TokenizerPrefetch:
    """The front's tokenizer, loaded on a thread from where the core will say it is (the --tokenizer directory,
    else the checkpoint directory), while the core starts. token_ids_only: a front that is sent token ids gets
    the detokenizing TokenIdsTokenizer where the files allow it."""

    def __init__(self, config: EngineConfig, token_ids_only: bool = False) -> None:
        self.path = config.tokenizer or (config.model if Path(config.model).is_dir() else None)
        self._loader = load_token_ids_tokenizer if token_ids_only else load_tokenizer
        self._load = Background(self._loader, self.path, name="railyard-tokenizer") if self.path else None

    @property
    def seconds(self) -> float | None:
        """How long the prefetch took (None: none ran, or it has not finished)."""
        return self._load.seconds if self._load is not None else None

    def result(self, path: str | None):
        """The tokenizer at `path` (the core's): the prefetched one if it is that, else loaded now (and an error
        raised here, not on the thread)."""
        if path is None:
            return None
        if self._load is not None and Path(path).resolve() == Path(self.path).resolve():
            try:
                return self._load.result()
            except Exception:
                pass
        return self._loader(path)


def _stop_process(process: multiprocessing.Process, ctx: zmq.Context, directory: str) -> None:
    """Stop the core (a moment to exit by itself, then SIGTERM, then SIGKILL), close the sockets, remove
    their directory; runs once."""
    process.join(2.0)  # a core that failed to start, or was told to shut down, is on its way out
    if process.is_alive():
        process.terminate()
        process.join(_STOP_S)
    if process.is_alive():
        process.kill()
        process.join(5.0)
    ctx.destroy(linger=0)
    shutil.rmtree(directory, ignore_errors=True)

