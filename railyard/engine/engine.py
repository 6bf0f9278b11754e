"""`Engine`: the synchronous step loop (add_request / abort / step / stats).

It validates requests at the door (a bad one is refused alone), lets the scheduler pick the
step's work, has the model runner execute it, then appends tokens, detokenises and applies the
stop rules. Callers that need concurrency wrap it (AsyncEngine); it has no threads of its own.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field

from railyard.engine.block_manager import BlockManager
from railyard.engine.config import EngineConfig, SamplingParams
from railyard.engine.model_runner import ModelRunner
from railyard.engine.models.loader import read_spec, resolve_model_dir
from railyard.engine.models.spec import ModelSpec
from railyard.engine.outputs import CompletionOutput, EngineStats, RequestMetrics, RequestOutput
from railyard.engine.scheduler import Scheduler
from railyard.engine.sampler import DoneSample, PendingSample
from railyard.engine.sequence import PLACEHOLDER, Sequence
from railyard.engine.tokenizer import IncrementalDetokenizer, load_tokenizer
from railyard.errors import ConfigError, InvalidRequestError

log = logging.getLogger("railyard.engine")


@dataclass
class _InFlight:
    """A launched step: the sequences it samples for, in row order, and its tokens on their way."""

    sampled: list[Sequence]
    pending: PendingSample | DoneSample


@dataclass
class _Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]
    detoks: list[IncrementalDetokenizer]
    texts: list[str]
    metrics: RequestMetrics
    finished_reported: bool = False
    stop_holdback: int = field(default=0)
    final_only: bool = False  # params.output_kind == "final_only": no outputs before it finishes

    @property
    def finished(self) -> bool:
        if len(self.seqs) == 1:
            return self.seqs[0].is_finished
        return all(s.is_finished for s in self.seqs)


class Engine:
    """One replica's engine: owns the scheduler, the block manager and the model runner."""

    @classmethod
    def from_config(cls, config: EngineConfig) -> "Engine":
        """An engine for a checkpoint directory, or, when no such directory exists, for a named shape
        (railyard.shapes: qwen2-7b, ...) with random weights, for benchmarks where no weights travel."""
        from pathlib import Path

        from railyard.shapes import is_shape, shape_config

        if is_shape(config.model) and not Path(config.model).exists():
            log.warning("model %r is a named shape: random weights, for benchmarking only", config.model)
            return cls(config, spec=ModelSpec.from_hf_config(shape_config(config.model)))
        return cls(config)

    def __init__(self, config: EngineConfig, *, spec: ModelSpec | None = None, executor=None) -> None:
        self.config = config
        if spec is None:
            model_dir = resolve_model_dir(config.model)
            spec = read_spec(model_dir)
            self.tokenizer = load_tokenizer(config.tokenizer or model_dir)
        else:  # a named shape with random weights (GPU benchmarks); token ids only
            model_dir = None
            self.tokenizer = load_tokenizer(config.tokenizer) if config.tokenizer else None
        self.spec = spec
        config.resolve(spec.max_position_embeddings)
        self.executor = executor or _make_executor(config, spec, model_dir)
        bm = BlockManager(self.executor.num_gpu_blocks, self.executor.num_cpu_blocks, config.block_size,
                          config.enable_prefix_caching)
        if bm.gpu.num_blocks * config.block_size < config.max_model_len:
            self.executor.shutdown()  # no engine: don't leave tensor-parallel workers behind
            raise ConfigError(
                f"the KV cache holds {bm.gpu.num_blocks * config.block_size} tokens, fewer than max_model_len "
                f"{config.max_model_len}; lower max_model_len or give the cache more memory"
            )
        self.block_manager = bm
        self.scheduler = Scheduler(config, bm)
        eos = set(spec.eos_token_ids)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = tuple(sorted(eos))
        self.requests: dict[str, _Request] = {}
        self._seq_ids = itertools.count()
        self.prompt_tokens_total = 0
        self.computed_tokens_total = 0
        self.generation_tokens_total = 0
        self.requests_finished_total = 0
        self.async_scheduling = config.async_scheduling and self.executor.supports_async
        self._in_flight: _InFlight | None = None
        self._num_history_requests = 0  # live requests whose sampling reads their output tokens
        log.info("engine ready: %d KV blocks of %d tokens (%d CPU swap blocks); max_model_len %d; "
                 "%d sequences of max_model_len fit at once", bm.gpu.num_blocks, config.block_size,
                 bm.cpu.num_blocks, config.max_model_len, bm.gpu.num_blocks * config.block_size // config.max_model_len)

    # -- requests --------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int] | None, params: SamplingParams | None = None,
                    *, prompt_token_ids: list[int] | None = None, arrival_time: float | None = None,
                    priority: int = 0) -> None:
        """Queue a request; raises InvalidRequestError (and queues nothing) if it cannot be served."""
        params = params or SamplingParams()
        if request_id in self.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        if priority and self.config.scheduling_policy != "priority":  # vLLM's rule: never silently ignored
            raise InvalidRequestError(f"priority {priority} needs priority scheduling (--scheduling-policy priority); "
                                      "this engine schedules first come, first served")
        text, ids = self._tokenize(prompt, prompt_token_ids)
        # The sampler indexes logits with stop ids: one bad id would fail the whole batch.
        self._check_in_vocab(params.stop_token_ids, "stop token id")
        max_len = self.config.max_model_len
        if len(ids) >= max_len:
            raise InvalidRequestError(
                f"the prompt has {len(ids)} tokens but max_model_len is {max_len}: at most {max_len - 1} prompt "
                "tokens fit (one is needed for the output); shorten the prompt")
        now = arrival_time if arrival_time is not None else time.monotonic()
        seqs = [Sequence(next(self._seq_ids), request_id, i, list(ids), params, now, priority, self.eos_token_ids)
                for i in range(params.n)]
        detoks = [IncrementalDetokenizer(self.tokenizer, ids, params.skip_special_tokens) for _ in seqs] \
            if self.tokenizer is not None else []
        holdback = max((len(s) for s in params.stop), default=1) - 1
        self.requests[request_id] = _Request(request_id, text, list(ids), params, seqs, detoks,
                                             [""] * params.n, RequestMetrics(now), stop_holdback=holdback,
                                             final_only=params.output_kind == "final_only")
        for seq in seqs:
            self.scheduler.add(seq)
        self.prompt_tokens_total += len(ids)
        if params.needs_output_history:
            self._num_history_requests += 1

    def _tokenize(self, prompt, prompt_token_ids) -> tuple[str | None, list[int]]:
        if prompt_token_ids is None and isinstance(prompt, list):
            prompt, prompt_token_ids = None, prompt
        if prompt_token_ids is not None:
            ids = list(prompt_token_ids)
            if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise InvalidRequestError("prompt token ids must be integers")
            self._check_in_vocab(ids, "prompt token id")
        else:
            if not isinstance(prompt, str):
                raise InvalidRequestError("prompt must be a string or a list of token ids")
            if self.tokenizer is None:
                raise InvalidRequestError("this engine has no tokenizer: send prompt token ids")
            ids = self.tokenizer.encode(prompt, add_special_tokens=True)
        if not ids:
            raise InvalidRequestError("the prompt is empty")
        return prompt, ids

    def _check_in_vocab(self, ids: list[int], what: str) -> None:
        bad = [t for t in ids if not 0 <= t < self.spec.vocab_size]
        if bad:
            raise InvalidRequestError(f"{what} {bad[0]} is outside the vocabulary [0, {self.spec.vocab_size})")

    def abort(self, request_id: str) -> bool:
        """Stop a request in any state and free its blocks at once; False if it is unknown or done."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return False
        if req.params.needs_output_history:
            self._num_history_requests -= 1
        for seq in req.seqs:
            if not seq.is_finished:
                self.scheduler.abort(seq)
            self.executor.forget(seq.seq_id)
        return True

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or self._in_flight is not None

    @property
    def num_requests(self) -> int:
        return len(self.requests)

    # -- the step --------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one batch; returns the requests that advanced (finished ones are forgotten after this).

        With asynchronous scheduling (the default where the executor supports it) a step launches batch
        N+1 before it waits for batch N's tokens and returns N's outputs: the host's scheduling and output
        work overlaps the device's forward pass. Decodes of N+1 read N's tokens on the device; a sequence
        that N's token finishes has one wasted row in N+1, discarded.
        """
        prev, self._in_flight = self._in_flight, None
        results: list[RequestOutput] = []
        if prev is not None and self._needs_known_tokens():
            results, prev = self._complete(prev), None
        out = self.scheduler.schedule()
        launched = self._launch(out) if not out.is_empty else None
        if prev is not None:
            results = self._complete(prev)
        if launched is not None:
            if self.async_scheduling:
                self._in_flight = launched
            else:
                results = self._complete(launched)
        return results

    def _needs_known_tokens(self) -> bool:
        """Penalties read every output token on the host, so those steps wait for the previous one."""
        return self._num_history_requests > 0

    def _launch(self, out) -> _InFlight:
        now = time.monotonic()
        pending = self.executor.launch(out)
        self.computed_tokens_total += out.num_batched_tokens
        self.scheduler.mark_computed(out)
        sampled: list[Sequence] = []
        for item in out.scheduled:
            seq = item.seq
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = now
            if item.sample:
                seq.pending_row = len(sampled)
                seq.output_token_ids.append(PLACEHOLDER)
                seq.num_placeholders += 1
                sampled.append(seq)
        return _InFlight(sampled, pending)

    def _complete(self, step: _InFlight) -> list[RequestOutput]:
        """Wait for a launched step's tokens and apply them: append, detokenise, stop rules, outputs."""
        result = step.pending.result()
        touched: dict[str, _Request] = {}
        bm, bs = self.block_manager, self.config.block_size
        for seq, token, logprobs in zip(step.sampled, result.token_ids, result.logprobs):
            req = self.requests.get(seq.request_id)
            if req is None or seq.is_finished:  # aborted, or stopped by its previous token
                continue
            n_known = seq.num_known_output_tokens
            seq.output_token_ids[n_known] = token
            seq.num_placeholders -= 1
            if req.metrics.first_scheduled_time is None:
                req.metrics.first_scheduled_time = seq.first_scheduled_time
            self._append(req, seq, n_known + 1, token, logprobs)
            if not seq.is_finished and seq.num_known_tokens % bs == 0:
                bm.cache_full_blocks(seq)  # its last block may have been waiting for this token
            touched[req.request_id] = req
        done_at = time.monotonic()
        results = []
        for req in touched.values():
            if req.metrics.first_token_time is None:
                req.metrics.first_token_time = done_at
            req.metrics.last_token_time = done_at
            finished = req.finished
            if finished or not req.final_only:
                results.append(self._output(req, finished))
            if finished:
                req.metrics.finished_time = done_at
                self.requests.pop(req.request_id, None)
                self.requests_finished_total += 1
                if req.params.needs_output_history:
                    self._num_history_requests -= 1
        return results

    def _append(self, req: _Request, seq: Sequence, n_out: int, token: int,
                logprobs: dict[int, float] | None) -> None:
        """Apply the stop rules to the n_out-th output token, just made known."""
        p = seq.params
        self.generation_tokens_total += 1
        if logprobs is not None:
            seq.output_logprobs.append(logprobs)
            seq.cumulative_logprob += logprobs[token]
        reason: tuple[str, int | str | None] | None = None
        if n_out >= p.min_tokens:
            if token in p.stop_token_ids:
                reason = ("stop", token)
            elif not p.ignore_eos and token in seq.eos_token_ids:
                reason = ("stop", None)
        if reason is None and req.detoks:
            delta = req.detoks[seq.index].append(token)
            if delta:
                req.texts[seq.index] += delta
                reason = self._check_stop_strings(req, seq.index, len(delta)) if n_out >= p.min_tokens else None
        if reason is None and p.max_tokens is not None and n_out >= p.max_tokens:
            reason = ("length", None)
        if reason is None and seq.num_prompt_tokens + n_out >= self.config.max_model_len:
            reason = ("length", None)
        if reason is not None:
            del seq.output_token_ids[n_out:]  # a row already launched for it is wasted
            seq.num_placeholders = 0
            seq.finish(*reason)
            self.scheduler.finish(seq)
            self.executor.forget(seq.seq_id)

    def _check_stop_strings(self, req: _Request, index: int, delta_len: int) -> tuple[str, str] | None:
        text = req.texts[index]
        for stop in req.params.stop:
            # Only the new text (plus a stop's length of overlap) can hold a new match.
            pos = text.find(stop, max(0, len(text) - delta_len - len(stop) + 1))
            if pos >= 0:
                end = pos + len(stop) if req.params.include_stop_str_in_output else pos
                req.texts[index] = text[:end]
                return ("stop", stop)
        return None

    def _output(self, req: _Request, finished: bool) -> RequestOutput:
        outs = []
        for seq in req.seqs:
            text = req.texts[seq.index] if req.texts else ""
            if not seq.is_finished and req.stop_holdback:
                text = text[: max(0, len(text) - req.stop_holdback)]  # a stop string may still be forming
            outs.append(CompletionOutput(
                index=seq.index, text=text, token_ids=seq.output_token_ids[:seq.num_known_output_tokens],
                cumulative_logprob=seq.cumulative_logprob if req.params.logprobs is not None else None,
                logprobs=list(seq.output_logprobs) if req.params.logprobs is not None else None,
                finish_reason=seq.finish_reason, stop_reason=seq.stop_reason))
        req.metrics.num_cached_prompt_tokens = req.seqs[0].num_cached_prompt_tokens
        return RequestOutput(req.request_id, req.prompt, req.prompt_token_ids, outs, finished, req.metrics)

    # -- introspection ---------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        bm, sch = self.block_manager, self.scheduler
        total = bm.gpu.num_blocks
        return EngineStats(
            num_running=len(sch.running), num_waiting=len(sch.waiting), num_swapped=len(sch.swapped),
            num_free_blocks=bm.num_free_blocks, num_total_blocks=total,
            kv_cache_usage=bm.num_used_blocks / total if total else 0.0,
            num_cpu_blocks=bm.cpu.num_blocks, num_free_cpu_blocks=bm.cpu.num_free,
            prefix_cache_queries=bm.prefix_queries, prefix_cache_hits=bm.prefix_hits,
            prompt_tokens_total=self.prompt_tokens_total, computed_tokens_total=self.computed_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            num_preemptions_total=sch.num_preemptions, num_requests_finished_total=self.requests_finished_total,
            block_size=self.config.block_size, max_num_seqs=self.config.max_num_seqs,
            max_num_batched_tokens=self.config.max_num_batched_tokens)

    def check_invariants(self) -> None:
        """Raise AssertionError if any KV block leaked or ref counts disagree with the live sequences."""
        self.block_manager.check_invariants(self.scheduler.live)

    def cached_block_hashes(self) -> set[int]:
        return self.block_manager.cached_block_hashes()

    def check_health(self) -> None:
        """Raise EngineDeadError if a tensor-parallel worker died, even while the engine is idle."""
        self.executor.check_health()

    def shutdown(self) -> None:
        self.executor.shutdown()


def _make_executor(config: EngineConfig, spec: ModelSpec, model_dir):
    if config.tensor_parallel_size > 1:
        from railyard.engine.tp_executor import TensorParallelExecutor

        return TensorParallelExecutor(config, spec, model_dir)
    return LocalExecutor(ModelRunner(config, spec, model_dir))


class LocalExecutor:
    """Runs the model in this process (tensor_parallel_size 1); launches steps without waiting for them."""

    supports_async = True

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.num_gpu_blocks = runner.num_gpu_blocks
        self.num_cpu_blocks = runner.num_cpu_blocks

    def launch(self, out):
        return self.runner.launch(out)

    def execute(self, out):
        return self.runner.execute(out)

    def forget(self, seq_id: int) -> None:
        self.runner.forget(seq_id)

    def check_health(self) -> None:
        pass  # nothing outside this process can die

    def shutdown(self) -> None:
        pass
