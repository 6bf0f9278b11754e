"""`RayEngineClient`: one served model behind Ray Serve, as the OpenAI front sees an engine.

It picks the model's length pool from the prompt's token count, streams the request from an
engine replica through a deployment handle (the request router chooses the replica), and retries
on another replica when the first one died before producing a token. A request that had already
streamed tokens ends with a clear EngineDeadError instead (its tokens cannot be taken back).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from railyard.engine.config import SamplingParams
from railyard.engine.core.model_info import ModelInfo
from railyard.engine.lora.peft import inspect_adapter
from railyard.engine.lora.request import LoRARequest
from railyard.engine.outputs import EngineStats, RequestOutput
from railyard.engine.core.validation import check_prompt_token_ids, check_sampling_params
from railyard.errors import EngineDeadError, InvalidRequestError, RailyardError, UnknownLoRAError
from railyard.model.spec import ModelSpec
from railyard.serve import metrics
from railyard.serve.replica import EngineRequest, ReplicaReport, ReplicaStarted

log = logging.getLogger("railyard.serve")

DEFAULT_MAX_ATTEMPTS = 3


@dataclass
class PoolHandle:
    """A length pool of a model: prompts up to max_prompt_tokens (None: any length) go to its deployment."""

    name: str
    max_prompt_tokens: int | None
    handle: Any  # ray.serve.handle.DeploymentHandle of the pool's engine deployment
    max_model_len: int | None = None


def choose_pool(pools: list[PoolHandle], num_prompt_tokens: int) -> PoolHandle:
    """The first pool whose limit takes the prompt; the last pool takes everything longer."""
    for pool in pools:
        if pool.max_prompt_tokens is None or num_prompt_tokens <= pool.max_prompt_tokens:
            return pool
    return pools[-1]


def _is_replica_loss(exc: BaseException) -> bool:
    """The replica (actor) or its engine went away: the request itself was fine."""
    from ray.exceptions import RayActorError, RayTaskError

    if isinstance(exc, RayActorError | EngineDeadError):
        return True
    return isinstance(exc, RayTaskError) and isinstance(exc.cause, RayActorError | EngineDeadError)


def _user_error(exc: BaseException) -> BaseException | None:
    """A railyard error raised inside the replica (bad request, overload), unwrapped for the front."""
    from ray.exceptions import RayTaskError

    cause = exc.cause if isinstance(exc, RayTaskError) else exc
    return cause if isinstance(cause, RailyardError) and not isinstance(cause, EngineDeadError) else None


_SHARED_SETTINGS = ("block_size", "max_num_seqs", "max_num_batched_tokens")


def fleet_stats(replicas: list[EngineStats]) -> EngineStats:
    """Counts summed over replicas; kv_cache_usage as the fleet's used fraction; settings from the first."""
    if not replicas:
        return EngineStats()
    total = EngineStats(**{f: getattr(replicas[0], f) for f in _SHARED_SETTINGS})
    for name, value in vars(replicas[0]).items():
        if name in _SHARED_SETTINGS or not isinstance(value, int | float) or name == "kv_cache_usage":
            continue
        setattr(total, name, sum(getattr(r, name) for r in replicas))
    used = sum(r.num_total_blocks - r.num_free_blocks for r in replicas)
    total.kv_cache_usage = used / total.num_total_blocks if total.num_total_blocks else 0.0
    # LoRA adapters with running / waiting requests on any replica (names, each once)
    total.running_lora_adapters = list(dict.fromkeys(a for r in replicas for a in r.running_lora_adapters))
    total.waiting_lora_adapters = list(dict.fromkeys(a for r in replicas for a in r.waiting_lora_adapters))
    return total


class RayRequestStream:
    """The outputs of one request from whichever replica serves it (RequestStream's interface)."""

    def __init__(self, client: RayEngineClient, pool: PoolHandle, request: EngineRequest) -> None:
        self.client = client
        self.pool = pool
        self.request = request
        self.request_id = request.request_id
        self.replica: str | None = None
        self.replicas_tried: list[str] = []
        self.finished = False
        self._response = None

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[RequestOutput]:
        attempts = 0
        try:
            while True:
                attempts += 1
                started = False
                self._response = self.pool.handle.options(stream=True).generate.remote(self.request.to_dict())
                try:
                    async for item in self._response:
                        if isinstance(item, ReplicaStarted):
                            self.replica = item.replica
                            self.replicas_tried.append(item.replica)
                            self.client.observe_start(item.replica)
                            continue
                        if isinstance(item, ReplicaReport):  # the final output, with the replica's stats
                            self.client.observe_replica(item)
                            item = item.output
                        started = True
                        self.finished = item.finished
                        self.client.observe_output(item)
                        yield item
                        if item.finished:
                            return
                    raise EngineDeadError(f"replica {self.replica} ended request {self.request_id} "
                                          "without finishing it")
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    user = _user_error(exc)
                    if user is not None:
                        raise user from None
                    if not _is_replica_loss(exc):
                        raise
                    if started:
                        raise EngineDeadError(
                            f"the engine replica serving request {self.request_id} died after it had started "
                            f"streaming ({type(exc).__name__}); the output is incomplete, retry the request") from None
                    if attempts >= self.client.max_attempts:
                        raise EngineDeadError(
                            f"request {self.request_id} failed on {attempts} replicas, the last with "
                            f"{type(exc).__name__}: {exc}") from None
                    log.warning("replica %s lost request %s before its first token (%s); retrying",
                                self.replica, self.request_id, type(exc).__name__)
                    metrics.RETRIES.labels(self.client.model_name).inc()
        finally:
            self.client._live.pop(self.request_id, None)
            if not self.finished:
                self.abort()

    def abort(self) -> None:
        """Stop the request (idempotent): cancelling the handle call aborts it in the replica's engine."""
        self.finished = True
        if self._response is not None:
            self._response.cancel()


class RayEngineClient:
    """An EngineClient (railyard.engine.client.base) over one model's Ray Serve deployments: the replicas'
    lifecycle is Ray Serve's, so start and shutdown have nothing to do, and the client is never dead
    as a whole (a replica that dies is retried around and replaced)."""

    def __init__(self, model_name: str, pools: list[PoolHandle], tokenizer, *, max_model_len: int, vocab_size: int,
                 model: str | None = None, tokenizer_path: str | None = None,
                 max_attempts: int = DEFAULT_MAX_ATTEMPTS, reasoning_parser: str = "auto",
                 tool_call_parser: str = "auto", spec: ModelSpec | None = None, max_loras: int = 0,
                 max_lora_rank: int = 0) -> None:
        """spec, max_loras, max_lora_rank: the model's description and its replicas' LoRA limits (max_loras 0:
        they serve no adapters), against which adapters are checked here, before any replica sees them."""
        if not pools:
            raise ValueError(f"model {model_name!r} has no engine deployments")
        self.model_name = model_name
        self.pools = pools
        self.tokenizer = tokenizer
        self.spec = spec
        self.model_info = ModelInfo(model=model or model_name, served_model_name=model_name,
                                    tokenizer=tokenizer_path, max_model_len=max_model_len, vocab_size=vocab_size,
                                    reasoning_parser=reasoning_parser, tool_call_parser=tool_call_parser,
                                    max_loras=max_loras, max_lora_rank=max_lora_rank)
        self._loras: dict[str, LoRARequest] = {}
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.max_attempts = max_attempts
        self.dead: EngineDeadError | None = None
        self._ids = itertools.count()
        self._live: dict[str, RayRequestStream] = {}
        self._replica_stats: dict[str, EngineStats] = {}
        self._replicas_serving: set[str] = set()
        metrics.REPLICAS_SERVING.labels(model_name)  # exported from the start, at 0 (no replica has served yet)
        self.stats = EngineStats()
        self.listener = None  # a StepListener (the front's metrics), told of every output

    async def start(self) -> None:
        pass  # Ray Serve starts the replicas

    async def shutdown(self) -> None:
        for stream in list(self._live.values()):
            stream.abort()

    @property
    def is_running(self) -> bool:
        return True

    @property
    def num_pending(self) -> int:
        return self.stats.num_pending

    def observe_output(self, out: RequestOutput) -> None:
        if self.listener is not None:
            self.listener.on_step([out], self.stats, time.monotonic())

    def observe_start(self, replica: str) -> None:
        """A replica started one of our requests; its first one is counted (the fleet's new capacity at work)."""
        if replica not in self._replicas_serving:
            self._replicas_serving.add(replica)
            metrics.REPLICAS_SERVING.labels(self.model_name).inc()

    def observe_replica(self, report: ReplicaReport) -> None:
        """Keep the fleet's stats (the sum over replicas of what each reported with its last finished request) and
        the replica's time per output token (times of the replica's clock, as the engine's own metric takes them)."""
        self._replica_stats[report.replica] = report.stats
        self.stats = fleet_stats(list(self._replica_stats.values()))
        if (tpot := report.output.metrics.time_per_output_token()) is not None:
            metrics.REPLICA_TPOT.labels(self.model_name, report.replica).observe(tpot)

    # -- LoRA adapters: checked and named here, loaded by each replica at its first request ----------------
    async def load_lora(self, request: LoRARequest) -> None:
        """Serve an adapter by name: checked against the model as the engines check it (InvalidRequestError for a
        bad one); each replica loads it when the router first sends it one of its requests."""
        info = self.model_info
        if not info.max_loras:
            raise InvalidRequestError(f"model {self.model_name!r} serves no LoRA adapters: set enable_lora in its "
                                      "engine options")
        if request.lora_name in self._loras:
            raise InvalidRequestError(f"LoRA adapter {request.lora_name!r} is already loaded; unload it first")
        if self.spec is not None:
            await asyncio.to_thread(inspect_adapter, request, self.spec, info.max_lora_rank)
        self._loras[request.lora_name] = request
        info.loras = list(self._loras.values())

    async def unload_lora(self, lora_name: str) -> None:
        """Stop routing requests to an adapter (requests running with it finish on their replicas)."""
        if self._loras.pop(lora_name, None) is None:
            raise UnknownLoRAError(f"no LoRA adapter named {lora_name!r} is loaded")
        self.model_info.loras = list(self._loras.values())

    async def list_loras(self) -> list[LoRARequest]:
        return list(self._loras.values())

    async def add_request(self, request_id: str, prompt: str | None, params: SamplingParams, *,
                          prompt_token_ids: list[int], arrival_time: float | None = None,
                          priority: int = 0, lora: LoRARequest | None = None) -> RayRequestStream:
        """A stream for the request, checked at the door; it is sent when the stream is first read. (arrival_time
        is this process's clock: the replica stamps its own, so latencies are measured on one clock.)"""
        ids = list(prompt_token_ids)
        check_prompt_token_ids(ids, vocab_size=self.vocab_size, max_model_len=self.max_model_len)
        check_sampling_params(params, vocab_size=self.vocab_size)
        if lora is not None and self._loras.get(lora.lora_name) != lora:
            raise UnknownLoRAError(f"no LoRA adapter named {lora.lora_name!r} is loaded")
        pool = choose_pool(self.pools, len(ids))
        stream = RayRequestStream(self, pool, EngineRequest(request_id, prompt, ids, params, priority, lora))
        self._live[request_id] = stream
        return stream

    async def generate(self, request_id: str, prompt: str | None, params: SamplingParams, *,
                       prompt_token_ids: list[int], **kwargs) -> AsyncIterator[RequestOutput]:
        stream = await self.add_request(request_id, prompt, params, prompt_token_ids=prompt_token_ids, **kwargs)
        async for out in stream:
            yield out

    def abort(self, request_id: str) -> None:
        stream = self._live.pop(request_id, None)
        if stream is not None:
            stream.abort()

    def new_request_id(self) -> str:
        return f"{self.model_name}-{time.monotonic_ns()}-{next(self._ids)}"
