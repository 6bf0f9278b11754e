"""Benchmark tools: offline throughput, online serving load, reports."""
