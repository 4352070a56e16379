"""A new stream's whole short prompt as one CUDA graph (a fresh prompt).

A short prompt's round is host work: on the H100 a 9-token prompt's round took 7.7 ms of a
64-token reply's ~31 for 0.87 ms of kernels (bench_lanes_cuda_h100_817e2e1_*, round_split
at 63de559), the eager mixers' ops between the graphed parts. A round whose one window is a
whole prompt of up to ROWS rows (a new stream: its session holds nothing) replays one graph
per prompt length n instead: a scratch session reset, every layer over the n rows as the
shared rounds run them (`model.residual`: the same ops on the same rows, so the same bits),
the scratch committed, the last row's logits. Its state (the attention rows and the pooled
keys of the blocks they complete, the GDN and PLE states) goes from the scratch into the
stream's session right after the replay (one multi-tensor copy; the piece's pending
"replayed" then only tells commit_all that it keeps all of its rows). Every length's graph is
captured at engine start (`capture_all`, one memory pool) and its replay timed; a capture
that fails turns the path off and rounds run eagerly, as before.

A round of several fresh whole prompts (arrivals together) replays their graphs one after
the other where that costs less than the eager round: the replays' measured GPU time
against the least host time the eager rounds of as many prompts took (on the H100 16
prompts of 20 tokens took 24.9 ms, 321 launches, for 1.12 ms of kernels: round_split at
90a5954).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence

import torch

from flashlane.kernels import compiles
from flashlane.lanes.records import Window
from flashlane.models.flashnext import FlashNext, commit_all
from flashlane.models.layers.gated_deltanet import SHORT_PROMPT
from flashlane.models.rows import Rows, copy_all
from flashlane.models.state import SessionState, reset_all, state_copies

__all__ = ["ROWS", "FreshPrompts", "fresh_prompts"]

# whole prompts up to this many rows replay (they run the recurrent GDN rule in any round)
ROWS = SHORT_PROMPT


def fresh_prompts(model: FlashNext, sessions: Sequence[SessionState]) -> FreshPrompts | None:
    """An engine's fresh prompts, every length captured now and logged where the model's
    graphs log; None where the blocks' parts do not replay (the CPU, --no-graphs, tensor
    parallel) or there are no sessions."""
    graphs = model.graphs
    if graphs is None or not sessions:
        return None
    fresh = FreshPrompts(model, sessions[0], log=graphs.log)
    secs, used = fresh.capture_all()
    if graphs.log is not None:
        graphs.log(f"flashlane: {len(fresh.entries)} fresh prompt graphs captured in "
                   f"{secs:.1f} s, {used / 2**20:.0f} MiB")  # fmt: skip
    return fresh


class FreshPrompts:
    """Whole short prompts of new streams, one graph per length (graphed=False: the same
    work eagerly, for the CPU's tests of what is copied where)."""

    def __init__(
        self,
        model: FlashNext,
        like: SessionState,
        graphed: bool = True,
        rows: int = ROWS,
        log: Callable[[str], None] | None = None,
    ):
        """like: a session of the engine's (its dtypes and KV cache kind for the scratch)."""
        cfg, blk = model.cfg, max(model.cfg.indexer_block, 1)
        device = model.embed_tokens.weight.device
        self.model, self.rows, self.graphed, self.log = model, rows, graphed, log
        self.block = blk
        capacity = -(-rows // blk) * blk
        self.scratch = SessionState.empty(
            cfg, capacity, like.attn_dtype(), like.state_dtype(), device, like.kv_fp8
        )
        self.entries: dict[int, tuple] = {}  # n -> (rows, graph or None, residual, logits)
        self.pool = torch.cuda.graph_pool_handle() if graphed else None
        self.failed: str | None = None
        self.capture_seconds, self.num_runs = 0.0, 0
        # n -> a replay's GPU ms; k -> the least host ms an eager round of k fresh prompts
        # took without compiling: what `takes` weighs for a round of several
        self.replay_ms: dict[int, float] = {}
        self.eager_ms: dict[int, float] = {}

    def capture_all(self) -> tuple[float, int]:
        """Every length's graph now (engine start: a length first met mid-serve paid its
        capture in a reply's first token, 22 ms on the embedded model): (seconds, bytes of
        GPU memory they took)."""
        device = self.model.embed_tokens.weight.device
        before = torch.cuda.memory_allocated(device)
        for n in range(1, self.rows + 1):
            if self._entry(n) is None:
                break
        return self.capture_seconds, torch.cuda.memory_allocated(device) - before

    def round(self, windows: Sequence[Window], rows: Rows, eager: Callable[[], tuple]) -> tuple:
        """The round's (residual rows, the drawing rows' fp32 logits): replayed where `takes`
        says so, else eager(), whose host time is kept where its windows are all fresh."""
        fresh = self._all_fresh(windows)
        got = self.run(rows) if fresh and self._replays_pay(windows) else None
        if got is not None:
            return got
        t, built = time.perf_counter(), compiles.count()
        got = eager()
        ms, k = 1e3 * (time.perf_counter() - t), len(windows)
        # a round that compiled Triton kernels is no price (it would hold replays up forever)
        if fresh and k > 1 and self.failed is None and compiles.count() == built:
            self.eager_ms[k] = min(ms, self.eager_ms.get(k, ms))
        return got

    def takes(self, windows: Sequence[Window]) -> bool:
        """Whether this replays a round of these windows: one fresh whole prompt, or several
        whose replays take less GPU time than the least host time an eager round of as many
        took (none measured yet: eager, which measures it)."""
        return self._all_fresh(windows) and self._replays_pay(windows)

    def _all_fresh(self, windows: Sequence[Window]) -> bool:
        return self.failed is None and bool(windows) and all(map(self._fresh, windows))

    def _replays_pay(self, windows: Sequence[Window]) -> bool:
        if len(windows) == 1:
            return True
        eager = self.eager_ms.get(len(windows))
        replays = sum(self.replay_ms.get(w.num_rows, float("inf")) for w in windows)
        return eager is not None and replays < eager

    def _fresh(self, w: Window) -> bool:
        return w.kind == "prompt" and w.start == 0 and w.last_piece and w.num_rows <= self.rows

    def run(self, rows: Rows) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The round's pieces (`takes`), one replay each -> (their residual rows [N, hc*H],
        each last row's fp32 logits [pieces, V]), each piece's state copied into its session
        at once (the next replay reuses the scratch); None where a graph could not be
        captured (the caller runs the forward itself)."""
        entries = [self.entries.get(p.length) or self._entry(p.length) for p in rows.pieces]
        if any(e is None for e in entries):
            return None
        self.num_runs += 1
        out, heads = None, []
        for piece, (static, graph, r, logits) in zip(rows.pieces, entries):
            static.token_ids.copy_(rows.token_ids[piece.rows])
            if graph is None:
                r, logits = self._forward(static)
            else:
                graph.replay()
            copy_all(*state_copies(self.scratch, piece.session, piece.length, self.block, False))
            piece.pending[("replayed", 0)] = (None, None)  # commit_all: it keeps all its rows
            if len(rows.pieces) == 1:  # the residual rows outlive the round (MTP cells)
                return r.clone(), logits
            if out is None:
                out = r.new_empty(rows.token_ids.shape[0], r.shape[-1])
            out[piece.rows].copy_(r)
            heads.append(logits.clone())
        return out, torch.cat(heads)

    def _forward(self, rows: Rows) -> tuple[torch.Tensor, torch.Tensor]:
        """What a replay runs: the scratch reset, the rows' forward, its commit, the head."""
        model = self.model
        reset_all([self.scratch], model.cfg)
        r = model.residual(rows)
        commit_all(model, [(rows.pieces[0], rows.pieces[0].length)])
        return r, model.logits(r[-1:])

    def _entry(self, n: int) -> tuple | None:
        device = self.model.embed_tokens.weight.device
        ids = torch.zeros(n, dtype=torch.long)
        static = Rows.of([(self.scratch, ids, 0, False, True)], device)
        if not self.graphed:
            self.entries[n] = (static, None, None, None)
            return self.entries[n]
        t = time.perf_counter()
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # compiles, and makes the rows' index tensors
                self._forward(static)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                r, logits = self._forward(static)
        except Exception as err:  # rounds run eagerly from now on
            self.failed = f"{type(err).__name__}: {err}"
            if self.log is not None:
                self.log(f"flashlane: fresh prompt graphs off ({self.failed})")
            torch.cuda.synchronize()
            return None
        self.capture_seconds += time.perf_counter() - t
        self.entries[n] = (static, graph, r, logits)
        self.replay_ms[n] = _timed(graph)
        return self.entries[n]


def _timed(graph: torch.cuda.CUDAGraph, times: int = 3) -> float:
    """A replay's GPU ms (the least of a few, after one that warms)."""
    graph.replay()
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(times + 1)]
    marks[0].record()
    for m in marks[1:]:
        graph.replay()
        m.record()
    marks[-1].synchronize()
    return min(a.elapsed_time(b) for a, b in itertools.pairwise(marks))
