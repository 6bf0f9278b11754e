"""The engine-core process: an EngineCore in a busy loop, fed and drained over zmq (vLLM v1's EngineCoreProc).

Between steps it takes every message that arrived (adds, aborts, stops, utility calls) without
blocking; with no work left it blocks on its input. After every step it sends that step's token deltas
and its stats in one message. It ignores Ctrl-C (the front, which gets it too, decides when the engine
stops), stops on SIGTERM or a Shutdown message, and exits by itself if its parent process dies.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import traceback

import msgspec
import zmq
from zmq.utils.monitor import recv_monitor_message

from railyard.engine.config import EngineConfig
from railyard.engine.core.wire import (
    UTILITY_ARGS,
    UTILITY_METHODS,
    Abort,
    AddRequest,
    CoreFailed,
    Ready,
    Shutdown,
    StartupFailed,
    StepOutputs,
    StopSequence,
    UtilityCall,
    UtilityResult,
    encoder,
    to_core_decoder,
)
from railyard.engine.exits import exit_when_parent_dies
from railyard.engine.startup.caches import bytecode_cache_state, configure_bytecode_cache
from railyard.engine.startup.gc_heap import freeze_startup_heap
from railyard.engine.startup.timings import StartupTimes
from railyard.errors import InvalidRequestError, RailyardError

log = logging.getLogger("railyard.engine")

_IDLE_POLL_MS = 1000  # an idle core wakes this often to check its tensor-parallel workers
_RECONNECT_MS = 10  # how soon a core's sockets retry a front's addresses (zmq's default: 100 ms)


class _Stop(Exception):
    """SIGTERM or a Shutdown message: leave the loop and shut the executor down."""


def run_engine_core(config: EngineConfig, input_address: str, output_address: str, log_level: int,
                    spawned_at: float | None = None, standby: bool = False) -> None:
    """Process entry point (spawned at time.time() `spawned_at`): build the core, report Ready or StartupFailed,
    then serve.

    standby: a core its owner (serve/standby.py) hands from front to front while it sleeps: its sockets reconnect to
    whichever front binds their addresses next, and it stops when its front goes away while it is awake (a replica
    that died without putting it back to sleep)."""
    startup = StartupTimes()
    if spawned_at is not None:  # a new interpreter, and the imports this module needs, before we get here
        startup.add("engine_spawn", time.time() - spawned_at)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _raise_stop)
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s[core]: %(message)s")
    with startup.phase("imports"):
        bytecode = configure_bytecode_cache()  # before torch: read from (and, the first time, written to) the root
        startup.bytecode_cache = bytecode_cache_state(bytecode)
        _import_engine()
    if bytecode is not None:
        log.info("Python bytecode kept in %s (the installation ships none beside its sources)", bytecode)
    _set_torch_threads(config)
    exit_when_parent_dies(grace_s=10.0)  # SIGTERM: the executor stops its tensor-parallel workers first
    ctx = zmq.Context()
    inp = ctx.socket(zmq.PULL)
    out = ctx.socket(zmq.PUSH)
    for sock in (inp, out):  # a front that binds the addresses anew (a standby's next owner) is found at once
        sock.setsockopt(zmq.RECONNECT_IVL, _RECONNECT_MS)
    front = inp.get_monitor_socket(zmq.EVENT_DISCONNECTED) if standby else None
    inp.connect(input_address)
    out.setsockopt(zmq.SNDHWM, 0)
    out.setsockopt(zmq.LINGER, 5000)
    out.connect(output_address)
    core = None
    try:
        from railyard.engine.core.engine_core import EngineCore

        try:
            core = EngineCore.from_config(config, startup)
        except RailyardError as exc:
            out.send(encoder.encode(StartupFailed(type(exc).__name__, str(exc))))
            return
        except _Stop:
            return
        except Exception as exc:  # a bug or a device failure while starting: say what, not a traceback
            log.debug("engine start-up failed:\n%s", traceback.format_exc())
            out.send(encoder.encode(StartupFailed(type(exc).__name__, f"{type(exc).__name__}: {exc}")))
            return
        with startup.phase("heap_freeze"):  # this process keeps the core for its life
            freeze_startup_heap()
        out.send(encoder.encode(Ready(core.model_info(), core.stats())))
        _serve(core, inp, out, front)
    except _Stop:
        pass
    except Exception as exc:  # the step loop died: tell the front why, then exit non-zero
        log.error("the engine core failed:\n%s", traceback.format_exc())
        out.send(encoder.encode(CoreFailed(f"the engine loop died: {type(exc).__name__}: {exc}")))
        raise SystemExit(1) from None
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # leaving already: a late SIGTERM must not interrupt that
        if core is not None:
            core.shutdown()
        if front is not None:
            inp.disable_monitor()
            front.close(linger=0)
        inp.close(linger=0)
        out.close()
        ctx.term()


def _serve(core, inp: zmq.Socket, out: zmq.Socket, front: zmq.Socket | None = None) -> None:
    """The busy loop: drain inputs, step while there is work, send each step's deltas and stats. front: a standby
    core's monitor of its input socket (its front's disconnects)."""
    poller = zmq.Poller()
    poller.register(inp, zmq.POLLIN)
    if front is not None:
        poller.register(front, zmq.POLLIN)
    while True:
        if front is not None and front.poll(0):
            _front_left(core, front)
        busy = core.can_step()  # asleep (sleep mode), requests wait until wake_up
        if not busy and not poller.poll(_IDLE_POLL_MS):
            core.check_health()
            continue
        handled = _drain(core, inp, out)
        if core.can_step():
            deltas = core.step()
            out.send(encoder.encode(StepOutputs(deltas, core.stats(), core.take_refused())), copy=False)
        elif handled:  # aborts, refusals or calls changed what the front should see
            out.send(encoder.encode(StepOutputs([], core.stats(), core.take_refused())))


def _front_left(core, front: zmq.Socket) -> None:
    """A standby core's front disconnected: asleep, it was handed back (the next front reconnects it); awake, its
    replica died without putting it back to sleep, and the core stops rather than hold the GPU for nobody."""
    while front.poll(0):
        recv_monitor_message(front)
    if not core.is_sleeping():
        log.warning("the front of this standby engine core went away while it was awake: stopping")
        raise _Stop


def _drain(core, inp: zmq.Socket, out: zmq.Socket) -> int:
    """Apply every message that has arrived, without blocking; returns how many there were."""
    n = 0
    while True:
        try:
            frame = inp.recv(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return n
        n += 1
        msg = to_core_decoder.decode(frame.buffer)
        if isinstance(msg, AddRequest):
            core.submit(msg.request_id, msg.prompt_token_ids, msg.params, arrival_time=msg.arrival_time,
                        priority=msg.priority, lora=msg.lora)
        elif isinstance(msg, Abort):
            for request_id in msg.request_ids:
                core.abort(request_id)
        elif isinstance(msg, StopSequence):
            core.stop_sequence(msg.request_id, msg.index, msg.stop)
        elif isinstance(msg, UtilityCall):
            if n > 1:  # the front sees what came before the call (an add, an abort) in its stats by the answer
                out.send(encoder.encode(StepOutputs([], core.stats(), core.take_refused())))
            out.send(encoder.encode(_utility(core, msg)))
        elif isinstance(msg, Shutdown):
            raise _Stop


def _utility(core, call: UtilityCall) -> UtilityResult:
    if call.method not in UTILITY_METHODS:
        return UtilityResult(call.call_id, False, error=f"unknown engine utility {call.method!r}")
    try:
        args = [msgspec.convert(arg, kind) for arg, kind in zip(call.args, UTILITY_ARGS.get(call.method, ()))]
        value = getattr(core, call.method)(*args)
    except InvalidRequestError as exc:  # the caller's request was bad (an adapter that does not fit): only it fails
        return UtilityResult(call.call_id, False, error=str(exc), kind=type(exc).__name__)
    except msgspec.ValidationError as exc:
        return UtilityResult(call.call_id, False, error=str(exc), kind="InvalidRequestError")
    except Exception as exc:  # the caller's to handle (an AssertionError from check_invariants, say)
        return UtilityResult(call.call_id, False, error=f"{type(exc).__name__}: {exc}")
    if isinstance(value, set | frozenset):
        value = sorted(value)
    return UtilityResult(call.call_id, True, value)


def _import_engine() -> None:
    """Import torch, Triton (where a GPU will use it) and the engine: timed as start-up's `imports` phase."""
    import torch

    import railyard.engine.core.engine_core  # noqa: F401  (the model runner, the layers, the attention backends)

    if torch.cuda.is_available():
        try:
            import triton  # noqa: F401
        except ImportError:
            pass


def _set_torch_threads(config: EngineConfig) -> None:
    """config.torch_threads; unset, on the CPU, leave one core to the front: its event loop must answer while the
    model runs (and torch's spinning OpenMP threads, one per core, would fight it for every core)."""
    import torch

    from railyard.engine.runner.model_runner import resolve_device

    if config.torch_threads is not None:
        torch.set_num_threads(config.torch_threads)
    elif resolve_device(config.device).type == "cpu":
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) - 1))


def _raise_stop(signum, frame) -> None:
    raise _Stop
