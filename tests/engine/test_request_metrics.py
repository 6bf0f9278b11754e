"""RequestMetrics: the per-request time per output token the server's and the serve layer's metrics observe."""

from __future__ import annotations

from railyard.engine.outputs import RequestMetrics


def test_time_per_output_token_spreads_first_to_last_token_over_the_tokens_after_the_first():
    m = RequestMetrics(arrival_time=0.0, first_token_time=1.0, last_token_time=1.5, num_output_tokens=11)
    assert m.time_per_output_token() == 0.05


def test_a_request_of_fewer_than_two_tokens_has_no_time_per_output_token():
    assert RequestMetrics(arrival_time=0.0, first_token_time=1.0, last_token_time=1.0,
                          num_output_tokens=1).time_per_output_token() is None
    assert RequestMetrics(arrival_time=0.0).time_per_output_token() is None
