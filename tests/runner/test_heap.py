"""The server's heap freeze (runner/heap.py): what is frozen leaves every collection."""

import gc
import weakref

from flashlane.runner.heap import freeze_heap


class Node:
    def __init__(self) -> None:
        self.other = self  # a cycle: only the collector frees it


def test_a_frozen_cycle_is_left_to_the_process_and_a_later_one_is_collected():
    try:
        kept = Node()
        kept_ref = weakref.ref(kept)
        freeze_heap()
        assert gc.get_freeze_count() > 0
        later = Node()
        later_ref = weakref.ref(later)
        del kept, later
        gc.collect()
        assert kept_ref() is not None  # frozen: no collection walks it
        assert later_ref() is None
    finally:
        gc.unfreeze()
        gc.collect()
    assert kept_ref() is None
