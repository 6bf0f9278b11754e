"""One rule for whether a KV cache holds a sequence of max_model_len, shared by the engine (which refuses to start)
and the planner (which says so of a plan): sliding-window layers' blocks counted, and the longest length that fits
named."""

from __future__ import annotations

import pytest

from railyard.model.kv_fit import blocks_to_hold, kv_shortfall, longest_context


@pytest.mark.parametrize("sliding_window", [None, 128])
@pytest.mark.parametrize("num_blocks", [1, 2, 9, 40, 1000])
def test_the_context_a_cache_holds_is_the_longest_that_fits(num_blocks, sliding_window):
    fits = longest_context(num_blocks, 64, 16, sliding_window)
    assert fits % 16 == 0
    assert blocks_to_hold(fits, 64, 16, sliding_window) <= num_blocks
    assert blocks_to_hold(fits + 16, 64, 16, sliding_window) > num_blocks


def test_sliding_layers_need_more_than_the_tokens_themselves():
    """gpt-oss on an 80 GB card: 9,000 blocks are 144,000 tokens, yet 131,072 tokens prefilled 16,384 at a time
    need their full layers' 8,192 blocks and the sliding layers' chunk and window too."""
    assert kv_shortfall(9_000, 16, 131_072, 16_384, None) is None
    short = kv_shortfall(9_000, 16, 131_072, 16_384, 128)
    assert short is not None and short.tokens == 144_000 and short.sliding
    assert blocks_to_hold(short.fits, 16_384, 16, 128) <= 9_000 < blocks_to_hold(short.fits + 16, 16_384, 16, 128)
    assert short.describe() == ("the KV cache holds 144000 tokens, fewer than max_model_len 131072 (with its "
                                "sliding-window layers' blocks)")


def test_a_cache_without_room_for_a_block_of_context_fits_nothing():
    assert kv_shortfall(1, 16, 256, 64, 128).fits == 0
