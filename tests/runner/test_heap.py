"""The engine's heap freeze (runner/heap.py): frozen objects leave the collections, and a
thaw gives dead ones back, so an engine built after another frees the old one's cycles."""

import gc
import weakref

from flashlane.runner.heap import freeze_heap, thaw_heap


class Node:
    def __init__(self) -> None:
        self.other = self  # a cycle: only the collector frees it


def test_a_frozen_cycle_stays_until_thawed_then_is_collected():
    try:
        node = Node()
        ref = weakref.ref(node)
        freeze_heap()
        assert gc.get_freeze_count() > 0
        del node
        gc.collect()
        assert ref() is not None  # frozen: no collection sees it
        thaw_heap()
        assert gc.get_freeze_count() == 0
        gc.collect()
        assert ref() is None
    finally:
        gc.unfreeze()
