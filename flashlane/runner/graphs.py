"""CUDA graphs for the parts of a layer whose work depends on the row count alone.

A decode round launches hundreds of small kernels, and from Python each launch costs more
host time than the GPU spends on it. The hyper-connection read and the layer's MLP half
(residual write, MLP hyper-connection, router, experts, shared expert, residual write) read
nothing but their input rows and the weights, so one graph per (layer, part, rows) replays
them: captured at first use, replayed with the inputs copied into static buffers, the same
kernels with the same launch shapes, so the bits equal the eager run's. The mixers (session
state, cache lengths) stay eager. Graphs share one memory pool; parts run one after another
and their outputs are copied out, so no replay overwrites memory still in use.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class Graphs:
    def __init__(self, max_rows: int, log: Callable[[str], None] | None = None):
        self.max_rows = max_rows
        self.entries: dict[tuple, tuple[list[torch.Tensor], torch.cuda.CUDAGraph, tuple]] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.log = log
        self.failed: str | None = None
        self.capture_seconds = 0.0

    def run(self, key: tuple, fn: Callable, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """fn(*args) -> a tuple of tensors, through the graph of (key, row count, dtypes)."""
        rows = args[0].shape[0]
        if self.failed or rows > self.max_rows or torch.cuda.is_current_stream_capturing():
            return fn(*args)
        full = (*key, *(tuple(a.shape) for a in args), *(a.dtype for a in args))
        entry = self.entries.get(full)
        if entry is None:
            try:
                entry = self.entries[full] = self._capture(fn, args)
            except Exception as err:  # a part that cannot be captured runs eagerly from now on
                self.failed = f"{type(err).__name__}: {err}"
                if self.log is not None:
                    self.log(f"flashlane: CUDA graphs off ({self.failed})")
                torch.cuda.synchronize()
                return fn(*args)
        static_in, graph, static_out = entry
        for s, a in zip(static_in, args):
            s.copy_(a)
        graph.replay()
        return tuple(o.clone() for o in static_out)

    def _capture(self, fn: Callable, args: tuple) -> tuple:
        import time

        t = time.perf_counter()
        static_in = [a.clone() for a in args]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # compiles Triton kernels and warms the allocator
            fn(*static_in)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            static_out = fn(*static_in)
        self.capture_seconds += time.perf_counter() - t
        return static_in, graph, static_out
