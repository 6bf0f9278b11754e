"""/metrics speaks Prometheus with vLLM's metric names, and its counts agree with what the API reported."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

VLLM_SAMPLES = [
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total",
    "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
    "vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_count",
    "vllm:request_time_per_output_token_seconds_count", "vllm:e2e_request_latency_seconds_count",
    "vllm:request_queue_time_seconds_count",
]


def scrape(url: str) -> dict[str, float]:
    """Sample name -> value, summed over label sets, as parsed by Prometheus' own client parser."""
    resp = httpx.get(url + "/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(resp.text):
        for sample in family.samples:
            if sample.labels.get("le") is None:
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def test_metrics_expose_the_vllm_names(server):
    names = scrape(server.url)
    assert [n for n in VLLM_SAMPLES if n not in names] == []


def test_token_counters_and_latency_histograms_follow_a_request(server):
    before = scrape(server.url)
    body = {"model": server.model, "prompt": "count me", "max_tokens": 7, "ignore_eos": True}
    usage = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["usage"]
    server.idle_stats()
    after = scrape(server.url)
    delta = {name: after[name] - before.get(name, 0.0) for name in after}
    assert delta["vllm:prompt_tokens_total"] == usage["prompt_tokens"]
    assert delta["vllm:generation_tokens_total"] == usage["completion_tokens"] == 7
    assert delta["vllm:time_to_first_token_seconds_count"] == 1
    assert delta["vllm:inter_token_latency_seconds_count"] == 6  # one per token after the first
    assert delta["vllm:e2e_request_latency_seconds_count"] == 1
    assert delta["vllm:request_queue_time_seconds_count"] == 1
    assert delta["vllm:e2e_request_latency_seconds_sum"] >= delta["vllm:time_to_first_token_seconds_sum"] > 0


def test_prefix_cache_counters_report_a_shared_prefix(server):
    prefix = "A long shared system prompt that fills several KV blocks of sixteen tokens each. " * 2
    before = scrape(server.url)
    for suffix in ("one", "two"):
        body = {"model": server.model, "prompt": prefix + suffix, "max_tokens": 1}
        assert httpx.post(server.url + "/v1/completions", json=body, timeout=60).status_code == 200
    after = scrape(server.url)
    hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    queries = after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"]
    assert queries >= 2 * len(prefix) and hits >= 16 * (len(prefix) // 16 - 1)
