"""Prometheus metrics under vLLM's names (`vllm:*`), so existing dashboards and autoscalers work.

Engine-wide gauges and counters are read from the latest EngineStats at scrape time (the engine
owns the counts; nothing is counted twice). `railyard:engine_healthy` says whether the engine is alive;
once it is not, the load gauges read 0, so autoscalers and dashboards see no phantom load.
Per-request latencies are observed from each step's
outputs, as vLLM does: TTFT at the first token, inter-token latency at every later step, the
rest when a request finishes. The engine's start-up report (`railyard:startup_*`) is read as it stands.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from railyard.engine.outputs import EngineStats, RequestOutput
from railyard.engine.startup.timings import StartupTimes

_LABELS = ("model_name", "engine")
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)
_REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                    240.0, 480.0, 960.0, 1920.0, 7680.0)
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


class _EngineStatsCollector:
    """Gauges and counters straight from the engine's own stats."""

    def __init__(self, metrics: "ServerMetrics") -> None:
        self.metrics = metrics

    def collect(self):
        s, labels = self.metrics.stats, self.metrics.label_values
        healthy = self.metrics.healthy()
        family = GaugeMetricFamily("railyard:engine_healthy", "1 while the engine is alive, 0 once it has died.",
                                   labels=_LABELS)
        family.add_metric(labels, 1.0 if healthy else 0.0)
        yield family
        live = 1 if healthy else 0  # a dead engine holds no requests and no KV cache
        for name, doc, value in (
            ("vllm:num_requests_running", "Number of requests in model execution batches.", s.num_running * live),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", s.num_waiting * live),
            ("vllm:num_requests_swapped", "Number of requests swapped to CPU.", s.num_swapped * live),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.kv_cache_usage * live),
        ):
            family = GaugeMetricFamily(name, doc, labels=_LABELS)
            family.add_metric(labels, value)
            yield family
        for name, doc, value in (
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens_total),
            ("vllm:generation_tokens", "Number of generation tokens processed.", s.generation_tokens_total),
            ("vllm:num_preemptions", "Cumulative number of preemptions from the engine.", s.num_preemptions_total),
            ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
             s.prefix_cache_queries),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", s.prefix_cache_hits),
            ("railyard:engine_steps", "Forward passes the engine ran.", s.num_steps_total),
            ("railyard:computed_tokens", "Tokens run through the model (prefill chunks and decodes).",
             s.computed_tokens_total),
            ("railyard:decode_rows", "Of the computed tokens, single-token decodes (the rest is prefill).",
             s.decode_rows_total),
            ("railyard:prefill_steps", "Of the forward passes, those that carried prefill tokens.",
             s.prefill_steps_total),
            ("railyard:triton_jit_after_ready", "Triton kernels compiled or loaded after the engine was ready "
             "(first-use work on the step loop; 0 when the start-up warm-up covered every step).",
             s.jit_after_ready_total),
        ):
            family = CounterMetricFamily(name, doc, labels=_LABELS)
            family.add_metric(labels, value)
            yield family
        if self.metrics.max_loras:
            yield self._lora_info(s, live)

    def _lora_info(self, s: EngineStats, live: int) -> GaugeMetricFamily:
        """vLLM's LoRA gauge (which the Gateway API inference extension's LoRA affinity reads): the adapters with
        running and waiting requests, comma-separated, and the adapters one step may mix; the value is when it
        was read."""
        family = GaugeMetricFamily("vllm:lora_requests_info", "Running stats on lora requests.",
                                   labels=("model_name", "max_lora", "waiting_lora_adapters", "running_lora_adapters"))
        waiting = ",".join(s.waiting_lora_adapters) if live else ""
        running = ",".join(s.running_lora_adapters) if live else ""
        family.add_metric([self.metrics.label_values[0], str(self.metrics.max_loras), waiting, running], time.time())
        return family


class _StartupCollector:
    """The engine's start-up report: seconds per phase, weight-load throughput, Triton compiles."""

    def __init__(self, startup: StartupTimes, label_values: list[str]) -> None:
        self.startup, self.label_values = startup, label_values

    def collect(self):
        st, labels = self.startup, self.label_values
        family = GaugeMetricFamily("railyard:startup_phase_seconds",
                                   "Seconds of each start-up phase (exclusive, they add up to the start-up time).",
                                   labels=(*_LABELS, "phase"))
        for phase, seconds in st.ordered():
            family.add_metric([*labels, phase], seconds)
        yield family
        family = GaugeMetricFamily("railyard:startup_weight_loading_seconds",
                                   "Seconds of the weight_loading phase by part (read, to_device, copy, other).",
                                   labels=(*_LABELS, "part", "reader"))
        for part, seconds in st.weight_parts.items():
            family.add_metric([*labels, part, st.weights_reader or ""], seconds)
        yield family
        family = GaugeMetricFamily("railyard:startup_background_seconds",
                                   "Seconds of start-up work run on threads beside the phases (the front's tokenizer).",
                                   labels=(*_LABELS, "task"))
        for task, seconds in st.background.items():
            family.add_metric([*labels, task], seconds)
        yield family
        for name, doc, value in (
            ("railyard:startup_seconds", "Start-up time: the sum of the phases.", st.total_s),
            ("railyard:startup_weight_bytes", "Bytes of weights read from the checkpoint at start-up.",
             st.weight_bytes),
            ("railyard:startup_weights_gb_per_second", "Weight loading throughput at start-up, GB/s (0: none read).",
             st.weights_gb_per_s or 0.0),
            ("railyard:startup_triton_jit_seconds",
             "Seconds Triton spent compiling or loading kernels at start-up (within the phases).", st.triton_jit_s),
            ("railyard:startup_triton_kernels", "Triton kernels JIT'd at start-up.", st.triton_kernels),
            ("railyard:startup_triton_compiled", "Of those, kernels compiled anew (Triton cache misses).",
             st.triton_compiled),
        ):
            family = GaugeMetricFamily(name, doc, labels=_LABELS)
            family.add_metric(labels, value)
            yield family


class ServerMetrics:
    """One server's metrics registry; an engine client's StepListener."""

    def __init__(self, model_name: str, stats: EngineStats | None = None,
                 healthy: Callable[[], bool] | None = None, startup: StartupTimes | None = None,
                 max_loras: int = 0) -> None:
        """max_loras: the LoRA adapters one engine step may mix (0: the engine serves none)."""
        self.registry = CollectorRegistry()
        self.max_loras = max_loras
        self.label_values = [model_name, "0"]
        self.stats = stats or EngineStats()
        self.healthy = healthy or (lambda: True)
        self._last_token_time: dict[str, float] = {}
        self.registry.register(_EngineStatsCollector(self))
        if startup is not None:
            self.registry.register(_StartupCollector(startup, self.label_values))

        def histogram(name: str, doc: str, buckets) -> Histogram:
            return Histogram(name, doc, _LABELS, buckets=buckets, registry=self.registry).labels(*self.label_values)

        self.ttft = histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              _TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             _ITL_BUCKETS)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "Histogram of time_per_output_token_seconds per request.", _ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of e2e request latency in seconds.", _REQUEST_BUCKETS)
        self.queue = histogram("vllm:request_queue_time_seconds",
                               "Histogram of time spent in WAITING phase for request.", _REQUEST_BUCKETS)
        self.prompt_len = histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                                    _TOKEN_BUCKETS)
        self.output_len = histogram("vllm:request_generation_tokens", "Number of generation tokens processed.",
                                    _TOKEN_BUCKETS)
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.",
                               (*_LABELS, "finished_reason"), registry=self.registry)

    # -- StepListener ----------------------------------------------------------------------------
    def on_step(self, outputs: list[RequestOutput], stats: EngineStats, now: float) -> None:
        self.stats = stats
        for out in outputs:
            m = out.metrics
            previous = self._last_token_time.get(out.request_id)
            if previous is None:
                self.ttft.observe(m.first_token_time - m.arrival_time)
            else:
                self.itl.observe(m.last_token_time - previous)
            self._last_token_time[out.request_id] = m.last_token_time
            if out.finished:
                self._finished(out)

    def on_abort(self, request_id: str) -> None:
        self._last_token_time.pop(request_id, None)

    def _finished(self, out: RequestOutput) -> None:
        m = out.metrics
        self._last_token_time.pop(out.request_id, None)
        self.e2e.observe(m.finished_time - m.arrival_time)
        self.queue.observe(m.first_scheduled_time - m.arrival_time)
        if (tpot := m.time_per_output_token()) is not None:
            self.tpot.observe(tpot)
        self.prompt_len.observe(m.num_prompt_tokens)
        self.output_len.observe(m.num_output_tokens)
        for c in out.outputs:
            self.success.labels(*self.label_values, c.finish_reason or "stop").inc()

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
