"""The messages between a front and its engine-core process, and their msgpack codec (msgspec).

front -> core: AddRequest, Abort, StopSequence, UtilityCall, Shutdown.
core -> front: Ready or StartupFailed (once), then StepOutputs (per step: token deltas + stats),
UtilityResult, and CoreFailed if the step loop dies. Every message is one zmq frame.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

from railyard.engine.config import SamplingParams
from railyard.engine.core.model_info import ModelInfo
from railyard.engine.lora.request import LoRARequest
from railyard.engine.outputs import EngineStats, SeqDelta
from railyard.errors import InvalidRequestError, UnknownLoRAError


class AddRequest(msgspec.Struct, tag="add", array_like=True):
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    priority: int = 0
    lora: LoRARequest | None = None


class Abort(msgspec.Struct, tag="abort", array_like=True):
    request_ids: list[str]


class StopSequence(msgspec.Struct, tag="stop", array_like=True):
    """A stop string matched in the front: finish that sequence (not an abort: it counts as finished)."""

    request_id: str
    index: int
    stop: str


# What a front may ask the core between steps (tests, debugging, the router's prefix view, LoRA adapters, sleep mode).
UTILITY_METHODS = ("check_invariants", "cached_block_hashes", "check_health", "load_lora", "unload_lora", "list_loras",
                   "sleep", "wake_up", "is_sleeping", "device_memory")
# The argument types of the utilities that take any (msgpack carries a LoRARequest as a plain map).
UTILITY_ARGS: dict[str, tuple[type, ...]] = {"load_lora": (LoRARequest,), "unload_lora": (str,), "sleep": (int,),
                                             "wake_up": (list[str] | None,)}
# Errors a utility call or an add may end in that belong to the caller's request (HTTP 4xx), by type name.
REQUEST_ERRORS: dict[str, type[InvalidRequestError]] = {
    "InvalidRequestError": InvalidRequestError, "UnknownLoRAError": UnknownLoRAError}


def request_error(kind: str | None, message: str) -> InvalidRequestError | None:
    """The request error a refusal or a failed call carried across the process boundary (None: not one)."""
    cls = REQUEST_ERRORS.get(kind or "")
    return None if cls is None else cls(message)


class UtilityCall(msgspec.Struct, tag="call", array_like=True):
    call_id: int
    method: str  # one of UTILITY_METHODS
    args: list[Any] = []  # as UTILITY_ARGS types them


class Shutdown(msgspec.Struct, tag="shutdown", array_like=True):
    pass


class Ready(msgspec.Struct, tag="ready", array_like=True):
    model_info: ModelInfo
    stats: EngineStats


class StartupFailed(msgspec.Struct, tag="startup_failed", array_like=True):
    """The engine could not start; `kind` names the railyard error type (ConfigError, ModelLoadError, ...)."""

    kind: str
    message: str


class RequestRefused(msgspec.Struct, array_like=True):
    request_id: str
    message: str
    kind: str = "InvalidRequestError"  # one of REQUEST_ERRORS (an unknown LoRA adapter is its own)


class StepOutputs(msgspec.Struct, tag="step", array_like=True, gc=False):
    deltas: list[SeqDelta]
    stats: EngineStats
    refused: list[RequestRefused] = []


class UtilityResult(msgspec.Struct, tag="result", array_like=True):
    call_id: int
    ok: bool
    value: Any = None
    error: str | None = None
    kind: str | None = None  # the error's type name (REQUEST_ERRORS: the caller's own error, not the engine's)


class CoreFailed(msgspec.Struct, tag="failed", array_like=True):
    message: str


ToCore = Union[AddRequest, Abort, StopSequence, UtilityCall, Shutdown]
FromCore = Union[Ready, StartupFailed, StepOutputs, UtilityResult, CoreFailed]

encoder = msgspec.msgpack.Encoder()
to_core_decoder = msgspec.msgpack.Decoder(ToCore)
from_core_decoder = msgspec.msgpack.Decoder(FromCore)
