"""Python's collector in a GPU server's process.

A full collection walks every object the collector tracks: an engine's tokenizer, model,
graphs and tables make some 300,000, and one such collection took 183 ms inside a timed pass
on the H100's host (draft_overhead_h100_a9a8031_*, where a pass of 64 streams takes 82 ms):
a stall for every stream on the device. `flashlane serve` builds one engine and serves until
it exits, so once the engine is built its objects are frozen (moved out of every later
collection) and collections walk only what requests allocate; vLLM freezes its engine
process's heap after start-up too. A process that builds engine after engine (the tests, a
benchmark's sweep) must not: the old engines' reference cycles, and the device memory they
hold, would never be collected.
"""

from __future__ import annotations

import gc


def freeze_heap() -> None:
    """Collect, then freeze every object alive now."""
    gc.collect()
    gc.freeze()
