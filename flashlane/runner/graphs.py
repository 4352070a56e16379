"""CUDA graphs for the parts of a layer whose work depends on the row count alone.

A decode round launches hundreds of small kernels, and from Python each launch costs more
host time than the GPU spends on it. The hyper-connection read with the mixer's row-wise
input projections (GDN: qkv, gates; attention: q, k, v and the indexer's, normed and roped
with the rows' cos/sin as inputs) and the layer's MLP half (the mixer's output projection
and residual write, the MLP hyper-connection, router, experts, shared expert) read nothing
but their input rows and the weights, so one graph per (layer, part, bucket) replays them.
When the rows are B verify windows of one width T, a PLE layer and a GDN layer's conv (with
the sessions' conv windows as inputs) replay too, on [B, T] inputs: the bucket counts
windows. The recurrent rule, the attention caches and the indexer (session state, cache
lengths) stay eager.

A call of n rows runs in the smallest bucket of at least n rows (1, 2, 4, ..., max_rows):
its rows are copied into the graph's static inputs and the rows past n keep whatever they
held, which cannot change the first n because every kernel here is row-invariant
(DESIGN.md section 1; tests/gpu checks replays against the eager run bit for bit). Graphs
share one memory pool, so a replay may write where another graph's outputs lie: an output is
either copied out or (`views`) used up before the next replay of any graph.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from flashlane.kernels import row_kind
from flashlane.runner.graphed_blocks import graphed_block
from flashlane.runner.parts import block_parts


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

    def run(
        self, key: tuple, fn: Callable, *args: torch.Tensor, views: int = 0
    ) -> tuple[torch.Tensor, ...]:
        """fn(*args) -> a tuple of tensors, through the graph of (key, bucket, trailing shapes).
        Outputs are copies, except the first `views`: those are views of the graphs' pool,
        which the next replay of any graph may overwrite (for outputs used up at once)."""
        rows = args[0].shape[0]
        size = bucket_of(rows, self.sizes)
        # a forward of prompt and decode rows runs eagerly: the FP8 GEMMs split its rows by
        # kind (kernels/row_kind.py), which a graph of `size` rows cannot
        capturing = torch.cuda.is_current_stream_capturing()
        if self.failed or size is None or capturing or row_kind.is_mixed():
            return fn(*args)
        shapes = (*(tuple(a.shape[1:]) for a in args), *(a.dtype for a in args))
        full = (*key, size, *shapes, *row_kind.key())
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
        # the inputs in one call (an eager round replays a graph a part: its copies' host time
        # was 0.60 ms of a 20-token prompt's 6.15 ms round on the H200, 44 copy_ calls)
        torch._foreach_copy_([s[:rows] for s in static_in], list(args))
        graph.replay()
        return tuple(o[:rows] if i < views else o[:rows].clone() for i, o in enumerate(static_out))

    def block(self, layer, x: torch.Tensor, rows, rotary, kernels) -> torch.Tensor:
        """A block's forward with its row-count-only parts replayed (the model's blocks
        call this when given graphs: runner/graphed_blocks.py runs them, Flash Next's
        through runner/trunk.py's layer)."""
        return graphed_block(layer, x, rows, rotary, kernels, self)

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
    """Capture every layer's parts (the MTP head's layers too: a draft step replays them) at
    every bucket now (engine start), with zero inputs, for
    plain rows and for windows one row wide (decode); wider windows are captured when first
    met. Returns (seconds, bytes of GPU memory the graphs took)."""
    dev = model.embed_tokens.weight.device
    t, before = time.perf_counter(), torch.cuda.memory_allocated(dev)
    run_all_parts(model, graphs)
    torch.cuda.synchronize(dev)
    return time.perf_counter() - t, torch.cuda.memory_allocated(dev) - before


def run_all_parts(model, graphs) -> None:
    """Every layer's parts at every bucket of `graphs`, on zero inputs (capture_all's
    calls; tests/models/test_graph_split.py runs them on the CPU through its stand-in)."""
    cfg, dev, dtype = model.cfg, model.embed_tokens.weight.device, model.dtype
    zeros = dict(dtype=dtype, device=dev)
    mtp_layers = list(model.mtp.layers) if model.mtp is not None else []
    for layer in [*model.layers, *mtp_layers]:
        parts, key = block_parts(layer, model.kernels), id(layer)
        for size in graphs.sizes:
            r = torch.zeros(size, cfg.hc_count * cfg.hidden_size, **zeros)
            if cfg.family != "flashnext":
                _capture_plain(cfg, layer.kind, parts, key, graphs, r)
                continue
            if layer.ple is not None:
                ids = torch.zeros(size, cfg.ngram_size, dtype=torch.long, device=dev)
                window = torch.zeros(size, cfg.ple_tail, r.shape[-1], **zeros)
                graphs.run((key, "ple"), parts["ple"], r[:, None], ids, window)
            if layer.kind != "linear":
                cos = torch.zeros(size, cfg.rotary_dim, **zeros)
                w, q, gate, *_ = graphs.run((key, "read"), parts["read"], r, cos, cos, views=7)
                graphs.run((key, "mlp"), parts["mlp"], r, torch.zeros_like(q), gate, w)
                continue
            w, _, _, _, z = graphs.run((key, "read"), parts["read"], r, views=5)
            o = torch.zeros(size, cfg.linear_num_v_heads, cfg.linear_v_head_dim, **zeros)
            graphs.run((key, "mlp"), parts["mlp"], r, o, z, w)
            window = torch.zeros(size, cfg.linear_conv_kernel - 1, cfg.linear_conv_dim, **zeros)
            graphs.run((key, "conv"), parts["conv"], r[:, None], window, views=7)


def _capture_plain(cfg, kind: str, parts: dict, key: int, graphs: Graphs, h) -> None:
    """A sibling's block (models/layers/plain_decoder.py) at h's row count: its "read" and
    "mlp" parts, and a GDN's "conv" for one-row windows."""
    size, zeros = h.shape[0], dict(dtype=h.dtype, device=h.device)
    if kind != "linear":
        cos = torch.zeros(size, cfg.rotary_dim, **zeros)
        q, gate, *_ = graphs.run((key, "read"), parts["read"], h, cos, cos, views=4)
        graphs.run((key, "mlp"), parts["mlp"], h, torch.zeros_like(q), gate)
        return
    z = graphs.run((key, "read"), parts["read"], h, views=4)[3]
    o = torch.zeros(size, cfg.linear_num_v_heads, cfg.linear_v_head_dim, **zeros)
    graphs.run((key, "mlp"), parts["mlp"], h, o, z)
    window = torch.zeros(size, cfg.linear_conv_kernel - 1, cfg.linear_conv_dim, **zeros)
    graphs.run((key, "conv"), parts["conv"], h[:, None], window, views=6)
