"""A new stream's whole short prompt as one CUDA graph (a fresh prompt).

A short prompt's round is host work: on the H100 a 9-token prompt's round took 7.7 ms of a
64-token reply's ~31 for 0.87 ms of kernels (bench_lanes_cuda_h100_817e2e1_*, round_split
at 63de559), the eager mixers' ops between the graphed parts. A round whose one window is a
whole prompt of up to ROWS rows (a new stream: its session holds nothing) replays one graph
per prompt length n instead: a scratch session reset, every layer over the n rows as the
shared rounds run them (`model.residual`: the same ops on the same rows, so the same bits),
the scratch committed, the last row's logits. Its state (the attention rows and the pooled
keys of the blocks they complete, the GDN and PLE states) goes from the scratch into the
stream's session at keep: the piece's pending "copies", one multi-tensor copy in
models/flashnext.py's commit_all. Every length's graph is captured at engine start
(`capture_all`, one memory pool); a capture that fails turns the path off and rounds run
eagerly, as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from flashlane.lanes.records import Window
from flashlane.models.flashnext import FlashNext, commit_all
from flashlane.models.layers.gated_deltanet import SHORT_PROMPT
from flashlane.models.rows import Rows
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

    def takes(self, windows: Sequence[Window]) -> bool:
        """Whether a round of these windows is one fresh whole prompt this replays."""
        if self.failed is not None or len(windows) != 1:
            return False
        w = windows[0]
        return w.kind == "prompt" and w.start == 0 and w.last_piece and w.num_rows <= self.rows

    def run(self, rows: Rows) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The round's one piece (`takes`) -> (its residual rows [n, hc*H], the last row's
        fp32 logits [1, V]), its state left in the piece's pending for commit; None where
        its graph could not be captured (the caller runs the forward itself)."""
        piece = rows.pieces[0]
        n = piece.length
        entry = self.entries.get(n) or self._entry(n)
        if entry is None:
            return None
        static, graph, r, logits = entry
        static.token_ids.copy_(rows.token_ids)
        if graph is None:
            r, logits = self._forward(static)
        else:
            graph.replay()
        dsts, srcs = state_copies(self.scratch, piece.session, n, self.block, mtp=False)
        piece.pending[("copies", 0)] = (dsts, srcs)
        self.num_runs += 1
        # the residual rows outlive the round (the MTP head's cells); the logits do not
        return r.clone(), logits

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
        return self.entries[n]
