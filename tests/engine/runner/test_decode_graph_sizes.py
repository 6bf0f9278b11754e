"""Which batch sizes get a captured decode graph, and how a step is padded to one (host-side logic)."""

from __future__ import annotations

from railyard.engine.runner.decode_graphs import graph_batch_sizes, padded_block_tables


def test_ladder_is_powers_of_two_then_multiples_of_16_up_to_the_max():
    assert graph_batch_sizes(256) == [1, 2, 4, 8] + list(range(16, 257, 16))
    assert graph_batch_sizes(20) == [1, 2, 4, 8, 16, 20]  # the max itself is always captured
    assert graph_batch_sizes(3) == [1, 2, 3]


def test_block_tables_are_padded_with_block_zero():
    out = padded_block_tables([[5, 7, 9], [3]])
    assert out.tolist() == [[5, 7, 9], [3, 0, 0]]
    assert out.dtype.name == "int32"
