"""Python's collector on a GPU engine's host.

A full collection walks every object the collector tracks: the engine's tokenizer, model,
graphs and tables make some 300,000, and one such collection took 183 ms inside a timed pass
on the H100's host (draft_overhead_h100_a9a8031_*: a pass of 64 streams is 82 ms), a stall
for every stream on the device. Once the engine is built those objects live as long as it
does, so they are frozen (moved out of every later collection) and collections walk only
what the rounds allocate. vLLM's engine freezes its heap after start-up too.
"""

from __future__ import annotations

import gc


def thaw_heap() -> None:
    """Give the objects an earlier freeze_heap froze back to the collector: an engine built
    after another was dropped lets the old one's cycles (and the GPU memory they hold) be
    collected as they were before any freeze."""
    gc.unfreeze()


def freeze_heap() -> None:
    """Collect, then freeze every object alive now."""
    gc.collect()
    gc.freeze()
