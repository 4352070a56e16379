"""CUDA graphs for the parts of a layer whose work depends on the row count alone.

A decode round launches hundreds of small kernels, and from Python each launch costs more
host time than the GPU spends on it. The hyper-connection read (with a GDN layer's input
projections) and the layer's MLP half (the mixer's output and residual write, the MLP
hyper-connection, router, experts, shared expert) read nothing but their input rows and the
weights, so one graph per (layer, part, bucket) replays them. A call of n rows runs in the
smallest bucket of at least n rows (1, 2, 4, ..., max_rows): its rows are copied into the
graph's static inputs and the rows past n keep whatever they held, which cannot change the
first n because every kernel here is row-invariant (DESIGN.md section 1; tests/gpu checks
replays against the eager run bit for bit). The mixers (session state, cache lengths) stay
eager. Graphs share one memory pool; parts run one after another and their outputs are copied
out, so no replay overwrites memory still in use.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def buckets(max_rows: int) -> list[int]:
    """1, 2, 4, ... up to and including max_rows."""
    out, b = [], 1
    while b < max_rows:
        out.append(b)
        b *= 2
    return [*out, max_rows]


def bucket_of(rows: int, sizes: list[int]) -> int | None:
    """The smallest bucket that holds `rows`, None past the largest."""
    return next((b for b in sizes if b >= rows), None)


class Graphs:
    def __init__(self, max_rows: int, log: Callable[[str], None] | None = None):
        self.sizes = buckets(max_rows)
        self.entries: dict[tuple, tuple[list[torch.Tensor], torch.cuda.CUDAGraph, tuple]] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.log = log
        self.failed: str | None = None
        self.capture_seconds = 0.0

    def run(self, key: tuple, fn: Callable, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """fn(*args) -> a tuple of tensors, through the graph of (key, bucket, trailing shapes)."""
        rows = args[0].shape[0]
        size = bucket_of(rows, self.sizes)
        if self.failed or size is None or torch.cuda.is_current_stream_capturing():
            return fn(*args)
        full = (*key, size, *(tuple(a.shape[1:]) for a in args), *(a.dtype for a in args))
        entry = self.entries.get(full)
        if entry is None:
            try:
                entry = self.entries[full] = self._capture(fn, args, size)
            except Exception as err:  # a part that cannot be captured runs eagerly from now on
                self.failed = f"{type(err).__name__}: {err}"
                if self.log is not None:
                    self.log(f"flashlane: CUDA graphs off ({self.failed})")
                torch.cuda.synchronize()
                return fn(*args)
        static_in, graph, static_out = entry
        for s, a in zip(static_in, args):
            s[:rows].copy_(a)
        graph.replay()
        return tuple(o[:rows].clone() for o in static_out)

    def _capture(self, fn: Callable, args: tuple, size: int) -> tuple:
        t = time.perf_counter()
        static_in = [a.new_zeros((size, *a.shape[1:])) for a in args]
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


def capture_all(model, graphs: Graphs) -> tuple[float, int]:
    """Capture every layer's parts at every bucket now (engine start), with zero inputs.
    Returns (seconds, bytes of GPU memory the graphs took)."""
    cfg, dev, dtype = model.cfg, model.embed_tokens.weight.device, model.dtype
    t, before = time.perf_counter(), torch.cuda.memory_allocated(dev)
    for layer in model.layers:
        parts = layer.graph_parts(model.kernels)
        for size in graphs.sizes:
            r = torch.zeros(size, cfg.hc_count * cfg.hidden_size, dtype=dtype, device=dev)
            out = graphs.run((id(layer), "read"), parts["read"], r)
            if layer.kind == "linear":
                w, z = out[0], out[4]
                o = torch.zeros(size, cfg.linear_num_v_heads, cfg.linear_v_head_dim,
                                dtype=dtype, device=dev)
                graphs.run((id(layer), "mlp"), parts["mlp"], r, o, z, w)
            else:
                a, w = out
                graphs.run((id(layer), "mlp"), parts["mlp"], r, torch.zeros_like(a), w)
    torch.cuda.synchronize(dev)
    return time.perf_counter() - t, torch.cuda.memory_allocated(dev) - before
