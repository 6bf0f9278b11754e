"""`railyard bench serve`: load an OpenAI-compatible server and measure what its users feel.

Requests are seeded synthetic token-id prompts sent to /v1/completions with streaming and
ignore_eos, so every request's input and output lengths are exact. Arrivals follow a Poisson
process at --request-rate (or all at once), optionally capped at --max-concurrency in flight.
Per request it records TTFT (first streamed chunk), every inter-token gap, end-to-end latency
and the server's own usage counts. A request that fails is counted, with its error's type and where
in the exchange it happened; nothing is retried (a retried POST would hide a server's lost request).

Every request gets a fresh connection (see `bench_client`): pooled keep-alive connections made the
client itself fail requests and stall for seconds at hundreds of streams.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import httpx

from railyard.bench.workload import LengthRange, reuse_warning, synthetic_requests

PERCENTILES = (50, 90, 99)


@dataclass
class ServeBenchConfig:
    url: str
    model: str
    num_prompts: int
    input_len: LengthRange
    output_len: LengthRange
    request_rate: float = math.inf  # requests/s of the Poisson arrivals; inf: all at once
    max_concurrency: int | None = None
    seed: int = 0
    api_key: str | None = None
    token_id_range: int = 256  # prompt token ids are drawn below this (valid in every vocabulary we serve)
    prefix_groups: int = 0  # > 0: prompts start with one of this many shared prefixes (round robin over groups)
    shared_prefix_len: int = 0  # tokens of each shared prefix
    timeout_s: float = 600.0
    structured_outputs: dict | None = None  # sent as each request's `structured_outputs` (vLLM's field)
    unique_schemas: bool = False  # give each request's JSON schema its own description: every one is first-seen


@dataclass
class RequestResult:
    """One request as the client saw it (times in seconds, from the benchmark start)."""

    start: float
    ok: bool = False
    error: str | None = None
    error_type: str | None = None  # "HTTP 503", "ReadError", "error event", ... (what failures are counted by)
    ttft: float | None = None
    latency: float | None = None
    itls: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0

    @property
    def tpot(self) -> float | None:
        if self.ok and self.output_tokens > 1:
            return (self.latency - self.ttft) / (self.output_tokens - 1)
        return None


def bench_client(cfg: ServeBenchConfig) -> httpx.AsyncClient:
    """The benchmark's HTTP client: at most max_concurrency connections, each used for one request only.

    Why no keep-alive: a server closes an idle pooled connection after its keep-alive timeout (uvicorn's is
    5 s), and a POST sent on it just then fails with httpx.ReadError although the server never saw it.
    httpcore checks a pooled connection when it hands it out, but at hundreds of streams the event loop
    can take seconds to actually send the request, long enough for the server's close to land in between.
    The pool's bookkeeping also costs O(idle x all connections) per request event, which stalled this
    loop for seconds (inflating TTFT) whenever many streams ended at once. A fresh connection costs one
    TCP handshake, counted in TTFT, as in vLLM's benchmark client before it pooled connections.
    """
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    limits = httpx.Limits(max_connections=cfg.max_concurrency, max_keepalive_connections=0)
    return httpx.AsyncClient(base_url=cfg.url.rstrip("/"), headers=headers, limits=limits, timeout=cfg.timeout_s)


def _fail(result: RequestResult, error_type: str, message: str) -> RequestResult:
    result.error_type, result.error = error_type, f"{error_type}: {message}"
    return result


def _error_message(body: bytes) -> str:
    """An error response's message: the OpenAI-style body's error.message, else its first 200 characters."""
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body[:200].decode(errors="replace")


def constraint_fields(cfg: ServeBenchConfig, index: int) -> dict:
    """The request's structured-outputs field, if the run constrains its outputs (a schema must outlast
    --output-len: a grammar that completes ends its request early, which counts as a wrong length)."""
    if cfg.structured_outputs is None:
        return {}
    so = cfg.structured_outputs
    if cfg.unique_schemas:  # a new cache key, so the server compiles it as a first-seen schema
        so = {**so, "json": {**so["json"], "description": f"railyard bench {cfg.seed}-{index}"}}
    return {"structured_outputs": so}


async def send_request(client: httpx.AsyncClient, cfg: ServeBenchConfig, prompt: list[int], output_len: int,
                       t0: float, extra: dict | None = None) -> RequestResult:
    """One streamed completion, timed; any failure is recorded on the result, never raised."""
    body = {"model": cfg.model, "prompt": prompt, "max_tokens": output_len, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, **(extra or {})}
    start = time.perf_counter()
    result = RequestResult(start=start - t0)
    last = start
    events, done, streaming = 0, False, False
    try:
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                return _fail(result, f"HTTP {resp.status_code}", _error_message(await resp.aread()))
            streaming = True
            async for line in resp.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                    continue
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[6:])
                events += 1
                if "error" in event:  # the server's in-band report of a failure mid-stream
                    return _fail(result, "error event", str(event["error"].get("message", event["error"])))
                if event.get("usage"):
                    result.prompt_tokens = event["usage"]["prompt_tokens"]
                    result.output_tokens = event["usage"]["completion_tokens"]
                if event.get("choices"):  # a chunk per step, with text or not (random-weight shapes decode to "")
                    now = time.perf_counter()
                    if result.ttft is None:
                        result.ttft = now - start
                    else:
                        result.itls.append(now - last)
                    last = now
        result.latency = time.perf_counter() - start
        if not done:
            return _fail(result, "truncated stream", f"the stream ended after {events} events without [DONE]")
        if result.output_tokens != output_len:
            return _fail(result, "wrong length", f"got {result.output_tokens} output tokens, asked for {output_len}")
        if result.ttft is None:
            return _fail(result, "no tokens", "the stream carried no tokens")
        result.ok = True
    except Exception as exc:  # one broken request must not end the run (and lose every other result)
        where = f"mid-stream, after {events} events" if streaming else "before the response headers"
        _fail(result, type(exc).__name__, f"{str(exc) or 'no message'} ({where})")
    return result


# The server's counters (railyard's /metrics) whose change over a run says what its engine steps carried.
SERVER_COUNTERS = ("railyard:engine_steps_total", "railyard:computed_tokens_total", "railyard:decode_rows_total",
                   "vllm:num_preemptions_total")
# Read where the server has it (railyard servers from 2026-12-04 on): the share of steps that carried a prefill.
PREFILL_STEPS = "railyard:prefill_steps_total"
# The prefix cache's prompt tokens looked up and found (vLLM's names): the run's hit rate.
PREFIX_CACHE = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")


async def fetch_metric_samples(url: str, names: tuple[str, ...]) -> list | None:
    """The named samples (prometheus_client's Sample: name, labels, value) of a Prometheus exposition at `url`, or
    None where the server has no such page."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        async with httpx.AsyncClient(timeout=10) as client:
            resp = await client.get(url)
        resp.raise_for_status()
        return [sample for family in text_string_to_metric_families(resp.text) for sample in family.samples
                if sample.name in names]
    except Exception:  # noqa: BLE001 -- a server without metrics: the report just lacks them
        return None


async def scrape_metrics(url: str, names: tuple[str, ...]) -> dict[str, float] | None:
    """The named samples of a Prometheus exposition at `url` (each summed over its label sets), or None where
    the server has no such page; a name the page lacks is missing from the dict."""
    samples = await fetch_metric_samples(url, names)
    if samples is None:
        return None
    values: dict[str, float] = {}
    for sample in samples:
        values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


async def scrape_server_counters(cfg: ServeBenchConfig) -> dict[str, float] | None:
    """SERVER_COUNTERS from the server's /metrics, or None where it has not all of them."""
    values = await scrape_metrics(cfg.url.rstrip("/") + "/metrics", (*SERVER_COUNTERS, PREFILL_STEPS, *PREFIX_CACHE))
    return values if values is not None and all(name in values for name in SERVER_COUNTERS) else None


def server_steps(before: dict[str, float] | None, after: dict[str, float] | None, duration_s: float) -> dict | None:
    """What the server's engine steps carried during the run: steps, and per step decode rows and prefill tokens
    (and, from servers that count them, the fraction of steps that carried a prefill)."""
    if before is None or after is None:
        return None
    d = {name: after[name] - before[name] for name in SERVER_COUNTERS}
    steps = d["railyard:engine_steps_total"]
    if steps <= 0:
        return None
    decode = d["railyard:decode_rows_total"]
    prefill = d["railyard:computed_tokens_total"] - decode
    out = {"steps": int(steps), "ms_per_step": round(1000 * duration_s / steps, 3),
           "decode_rows_per_step": round(decode / steps, 2), "prefill_tokens_per_step": round(prefill / steps, 2),
           "preemptions": int(d["vllm:num_preemptions_total"])}
    if PREFILL_STEPS in before and PREFILL_STEPS in after:
        out["prefill_step_fraction"] = round((after[PREFILL_STEPS] - before[PREFILL_STEPS]) / steps, 4)
    return out


def prefix_cache_hit_rate(before: dict[str, float] | None, after: dict[str, float] | None) -> float | None:
    """The share of the run's prompt tokens the server found in its prefix cache (None: it does not say)."""
    if before is None or after is None or not all(n in before and n in after for n in PREFIX_CACHE):
        return None
    queries, hits = (after[n] - before[n] for n in PREFIX_CACHE)
    return round(hits / queries, 4) if queries > 0 else None


async def run_serve_bench(cfg: ServeBenchConfig) -> tuple[list[RequestResult], float]:
    """Send the whole workload; returns per-request results and the wall time."""
    requests = synthetic_requests(cfg.num_prompts, cfg.input_len, cfg.output_len, cfg.token_id_range, cfg.seed)
    if cfg.prefix_groups > 0 and cfg.shared_prefix_len > 0:  # system prompts / documents shared by many requests
        prefix_rng = random.Random(cfg.seed + 2)
        prefixes = [[prefix_rng.randrange(cfg.token_id_range) for _ in range(cfg.shared_prefix_len)]
                    for _ in range(cfg.prefix_groups)]
        for i, req in enumerate(requests):
            req.prompt_token_ids = prefixes[i % cfg.prefix_groups] + req.prompt_token_ids
    rng = random.Random(cfg.seed + 1)
    gate = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
    async with bench_client(cfg) as client:

        async def one(i, req) -> RequestResult:
            if gate is None:
                return await send_request(client, cfg, req.prompt_token_ids, req.output_len, t0,
                                          constraint_fields(cfg, i))
            async with gate:
                return await send_request(client, cfg, req.prompt_token_ids, req.output_len, t0,
                                          constraint_fields(cfg, i))

        t0 = time.perf_counter()
        tasks = []
        for i, req in enumerate(requests):
            tasks.append(asyncio.ensure_future(one(i, req)))
            if math.isfinite(cfg.request_rate):
                await asyncio.sleep(rng.expovariate(cfg.request_rate))
        results = await asyncio.gather(*tasks)
        return list(results), time.perf_counter() - t0


def stats_ms(values: list[float]) -> dict[str, float | None]:
    """Mean, percentiles and the largest (for inter-token gaps: the longest stall any stream saw), of durations in
    seconds, in milliseconds."""
    if not values:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}, "max": None}
    ordered = sorted(values)
    return {"mean": round(1000 * sum(ordered) / len(ordered), 3),
            **{f"p{p}": round(1000 * percentile(ordered, p), 3) for p in PERCENTILES},
            "max": round(1000 * ordered[-1], 3)}


def percentile(ordered: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    k = (len(ordered) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summarize(cfg: ServeBenchConfig, results: list[RequestResult], duration_s: float,
              server: dict | None = None, prefix_hit_rate: float | None = None) -> dict:
    """The benchmark's JSON: throughput, latency distributions (ms), failures, and (where the server reports
    them) its prefix-cache hit rate over the run and what its engine steps carried."""
    ok = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    in_tokens = sum(r.prompt_tokens for r in ok)
    out_tokens = sum(r.output_tokens for r in ok)
    return {
        "url": cfg.url, "model": cfg.model, "num_prompts": cfg.num_prompts,
        "request_rate": cfg.request_rate if math.isfinite(cfg.request_rate) else "inf",
        "max_concurrency": cfg.max_concurrency,
        "input_len": f"{cfg.input_len.low}-{cfg.input_len.high}",
        "output_len": f"{cfg.output_len.low}-{cfg.output_len.high}",
        "structured_outputs": sorted(k for k in cfg.structured_outputs if k != "disable_any_whitespace")
        if cfg.structured_outputs else None,
        "unique_schemas": cfg.unique_schemas,
        "completed": len(ok), "failed": len(failed),
        "error_counts": dict(sorted(Counter(r.error_type for r in failed).items())),
        "errors": sorted({r.error for r in failed})[:5],
        "duration_s": round(duration_s, 3),
        "request_throughput": round(len(ok) / duration_s, 3),
        "output_token_throughput": round(out_tokens / duration_s, 3),
        "total_token_throughput": round((in_tokens + out_tokens) / duration_s, 3),
        "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
        "prefix_cache_hit_rate": prefix_hit_rate,
        "warnings": [w for w in [reuse_warning(prefix_hit_rate, cfg.prefix_groups > 0 and cfg.shared_prefix_len > 0)]
                     if w],
        "ttft_ms": stats_ms([r.ttft for r in ok]),
        "tpot_ms": stats_ms([r.tpot for r in ok if r.tpot is not None]),
        "itl_ms": stats_ms([x for r in ok for x in r.itls]),
        "e2el_ms": stats_ms([r.latency for r in ok]),
        "server_steps": server,
    }


def format_table(summary: dict) -> str:
    """A human-readable table of the summary."""
    rows = [("completed / failed", f"{summary['completed']} / {summary['failed']}"),
            *((f"  failed: {kind}", n) for kind, n in summary.get("error_counts", {}).items()),
            ("duration (s)", summary["duration_s"]),
            ("request throughput (req/s)", summary["request_throughput"]),
            ("output token throughput (tok/s)", summary["output_token_throughput"]),
            ("total token throughput (tok/s)", summary["total_token_throughput"]),
            ("server prefix-cache hit rate", summary.get("prefix_cache_hit_rate"))]
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2el_ms", "E2E latency")):
        for stat, value in summary[key].items():
            rows.append((f"{label} {stat} (ms)", value))
    rows = [(name, value) for name, value in rows if value is not None]  # a run with no completed request has none
    for name, value in (summary.get("server_steps") or {}).items():
        rows.append((f"server {name.replace('_', ' ')}", value))
    width = max(len(name) for name, _ in rows)
    line = "=" * (width + 16)
    return "\n".join([line, " serving benchmark ".center(width + 16, "="), *(f"{n:<{width}}  {v}" for n, v in rows),
                      line])


def results_to_dicts(results: list[RequestResult]) -> list[dict]:
    return [{**asdict(r), "tpot": r.tpot} for r in results]


def emit_report(report: dict, table: str, results: list[RequestResult], output: str | None,
                command: str = "railyard bench") -> int:
    """What every client benchmark command ends with: the table on stderr, the JSON on stdout, with `output` the
    JSON plus per-request results in that file, then its warnings and errors as lines on stderr; exit code 0 if
    any request completed, else 1, after a line with the first error (the server's own message)."""
    print(table, file=sys.stderr)
    print(json.dumps(report, indent=1))
    if output:
        with open(output, "w") as f:
            json.dump({**report, "requests": results_to_dicts(results)}, f, indent=1)
    for warning in report.get("warnings", []):
        print(f"{command}: warning: {warning}", file=sys.stderr)
    if report["completed"]:
        return 0
    first = report["errors"][0] if report.get("errors") else "no request was sent"
    print(f"{command}: error: all {report['failed']} requests failed; {first}", file=sys.stderr)
    return 1
