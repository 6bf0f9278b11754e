"""A serving process freezes its start-up heap: the objects alive at ready leave the collector's generations (a
full collection no longer walks them), the garbage start-up left is collected first, not frozen, and cycles made
after ready are still collected. Each case runs in its own interpreter: freezing is process-wide."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SETUP = """
import gc, weakref
from railyard.engine.startup.gc_heap import freeze_startup_heap, frozen_heap
class Node:
    pass
def cycle():
    node = Node(); node.self = node
    return weakref.ref(node)
"""


def run(body: str) -> str:
    done = subprocess.run([sys.executable, "-c", SETUP + textwrap.dedent(body)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_what_lives_at_ready_is_frozen_and_no_longer_walked_by_a_full_collection():
    out = run("""
        kept = [Node() for _ in range(1000)]
        before = len(gc.get_objects())
        frozen = freeze_startup_heap()
        walked = {id(o) for o in gc.get_objects()}
        print(frozen >= 1000, before >= 1000, any(id(k) in walked for k in kept), len(walked) < before - 1000)
    """)
    assert out == "True True False True"


def test_start_up_garbage_is_collected_not_frozen_and_later_cycles_are_still_collected():
    out = run("""
        startup_garbage = cycle()
        freeze_startup_heap()
        later = cycle()
        gc.collect()
        print(startup_garbage() is None, later() is None)
    """)
    assert out == "True True"


def test_a_with_block_freeze_gives_the_objects_back_to_the_collector_after():
    out = run("""
        with frozen_heap() as frozen:
            inside = gc.get_freeze_count()
        print(frozen > 0, inside > 0, gc.get_freeze_count())
    """)
    assert out == "True True 0"


def test_a_freeze_without_a_collection_keeps_start_up_garbage_for_the_processs_life():
    out = run("""
        startup_garbage = cycle()
        freeze_startup_heap(collect=False)
        gc.collect()
        print(startup_garbage() is None)
    """)
    assert out == "False"
