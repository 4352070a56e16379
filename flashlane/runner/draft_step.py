"""A drafted lone step (runner/lone_draft.py runs it): verify, acceptance, commit and the next
drafts, all on the device; and what a call of such steps costs a token (`priced`).

A drafted step of depth K feeds each session's window (its pending token and K drafts, at
its positions) through the model as B*(K+1) rows, draws greedily at every row, keeps the
rows up to the first draft that differs from the draw before it (kept = 1..K+1), commits the
state after the last kept row, and moves the pending token and position on. Then the MTP
head absorbs the window's cells (row i with the draw after it) and chains from the cell of
the last kept row: K new drafts for the next step. No host value enters a step.

Exactness: every op is the shared rounds' on the same rows, through the layers a plain step
runs (runner/trunk.py, with runner/lone_state.py's `Windowed`). The window's rows write their
keys at their own positions and attend through a table that names their session once per row
(kernels.attend_sessions: each row reads its own length); the recurrent rule runs the
window's rows from the session's state (read where it lies, through the table) and keeps the
state after each, so the commit is an index put back in place (`Windowed.commit`); conv
windows and PLE ids are the inputs' tails from the kept length on. Rows past the kept
ones leave keys beyond the length (written over before any row reads them) and cells in the
MTP cache past its own (likewise). The drafts steer only how many rows a step keeps: the
kept tokens are the greedy draws of the target, so a reply is the one plain steps give
(tests/runner/test_lone_draft.py, tests/gpu/test_lone_gpu.py,
tests/kernels/test_drafted_size_tables.py).
"""

from __future__ import annotations

import math

import torch

from flashlane.models.flashnext import FlashNext
from flashlane.models.state import SessionState
from flashlane.runner import trunk
from flashlane.runner.lone_buffers import RING
from flashlane.runner.lone_state import Windowed, attention_step

__all__ = ["DraftBuffers", "cells", "draft_step", "priced"]


@torch.no_grad()
def draft_step(
    model: FlashNext, sessions: list[SessionState], io: DraftBuffers, tables: dict | None
) -> None:
    """One drafted step (module docstring) of io's sessions, reading and writing io.
    `tables`: lone_step.session_tables(..., mtp=True) of the sessions, one row each (the
    window's rows get each session's row T times); None: the kernels make their own and the
    states are stacked (eager steps)."""
    cfg, kernels = model.cfg, model.kernels
    b, k = io.drafts.shape
    window = io.window  # [B, T]: tok and drafts are its views
    # as a plain step (lone_step.step): the first read's norm in the embedding's launch, the
    # rows' angles and attention_once's tensors in one (with `at`, each row's position
    # io.pos + j), each read's norm in the write before
    r, xn = trunk.embedded(model, window.flatten())
    at = torch.empty(b * (k + 1), dtype=io.pos.dtype, device=io.pos.device)  # [B*T]
    inv = model.rotary.inv(at.device)
    cos, sin, *once = kernels.step_angles(io.pos, inv, r.dtype, cfg.indexer_block, window=at)
    state = Windowed(sessions, tables or {}, window, at, (cos, sin, once))
    r, xn = trunk.layers(model, r, xn, state)
    # each row's draw (the first maximum, ties to the lower id: bf16 logits hold the fp32
    # ones' order) into ids, the kept rows (1..T), the host's verdict, the pending token and
    # position moved on: kept, kept - 1 and each session's last kept row among the B*T in
    # io.marks, all in one launch
    ids = torch.empty(b * (k + 1), dtype=io.pos.dtype, device=io.pos.device)  # [B*T]
    logits = model.head_logits(r, xn)
    kernels.accept_window(logits, io.drafts, io.firsts, io.out, io.tok, io.pos, io.marks, ids)
    kept, last, rows = io.marks
    state.commit(kept, last, kernels)
    heads = range(len(model.mtp.layers))
    mtp_tables = (
        [state.rows_of(("mtp", j)) for j in heads],
        [state.tables.get(("mtp", j)) for j in heads],
    )
    angles = (at, cos, sin, once)
    _draft_next(model, sessions, io, r, ids, angles, rows, mtp_tables)


def _draft_next(model, sessions, io, r, next_ids, angles, rows, tables) -> None:
    """The MTP head absorbs the window's cells (row i with the draw after it, at row i's
    position) and chains K drafts from the cell of each session's last kept row (`rows`).
    angles: the window rows' (positions, cos, sin, attention_once's); tables: (each head
    layer's table of the window's rows, of the sessions)."""
    mtp, k, cfg = model.mtp, io.drafts.shape[1], model.cfg
    heads = range(len(mtp.layers))
    window_tables, chain = tables
    window_caches = [[s.mtp[j] for s in sessions for _ in range(k + 1)] for j in heads]
    # the window cells' pre_fc norm also keeps each session's last kept row of r in io.last
    # (the hand-off's residual: kernels.rms_norm's keep, no index_select); their last write
    # makes xn, the mixer's norm of each session's last kept cell alone (hc_write_norm's rows)
    window = (window_caches, angles, window_tables, io.units, True)
    x, xn = cells(model, r, next_ids, *window, keep=(rows, io.last))
    # the last kept rows' cells are read where they lie by the first chained cell's norm
    # (kernels.rms_norm's rows, no copy)
    mixer, picked, pos = mtp.hyper_connection_mixer, rows, io.pos  # accept_window moved pos
    caches = [[s.mtp[j] for s in sessions] for j in heads]
    for d in range(k):
        # the first maximum; bf16 logits hold the fp32 ones' order (x unread: xn given)
        model.kernels.draft_pick(model.lm_head(mixer.read(x, xn)[0]), io.drafts, d)
        if d + 1 < k:  # cell at the pending token's position: the head's residual with draft d
            # at = pos + d, written by step_angles (no add)
            at = torch.empty_like(pos)
            inv = model.rotary.inv(at.device)
            c, s, *once = model.kernels.step_angles(
                pos, inv, x.dtype, cfg.indexer_block, window=at, first=d
            )
            angles = (at, c, s, once)
            x, xn = cells(model, x, io.drafts[:, d], caches, angles, chain, io.units, True, picked)
            picked = None


def cells(
    model, residual, next_ids, caches, angles, tables, units, mixed: bool, picked=None, keep=None
):
    """MTP cells (models/layers/mtp.py) of rows at positions `at`, each reading and writing
    its own session's head cache -> (the cells' output residual, with `mixed` the head's
    mixer's norm of it from the last write's launch, else None). units: ones [>= rows, hc];
    picked: the rows of `residual` the cells read (None: all); keep: (picks [B], out [B, D])
    out[b] = residual[picks[b]] from the pre_fc norm's launch (kernels.rms_norm's keep), and
    the mixer's norm of the output's rows picks alone [B, D] (kernels.hc_write_norm's rows).

    Fewer launches, the same bits: the embedding and its norm are one (kernels.embed_rows);
    fc_hidden(hn_c) + e on every stream c is a hyper-connection write of e with unit weights
    (y * 1 is y: one rounding, as the add's), whose launch makes the first layer's read norm
    too (kernels.hc_write_norm)."""
    mtp, cfg, kernels = model.mtp, model.cfg, model.kernels
    at, cos, sin, once = angles
    norm = mtp.pre_fc_norm_embedding
    _, en = kernels.embed_rows(model.embed_tokens.weight, next_ids, 1, (norm.weight, norm.eps))
    e = mtp.fc_embedding(en)
    pre = mtp.pre_fc_norm_hidden
    if keep is None:
        hn = kernels.rms_norm(residual, pre.weight, pre.eps, pre.group, rows=picked)
    else:
        hn = kernels.rms_norm(residual, pre.weight, pre.eps, pre.group, keep=keep)
    hn = hn.unflatten(-1, (cfg.hc_count, cfg.hidden_size))
    h = mtp.fc_hidden(hn).flatten(-2)
    first = mtp.layers[0].attn_hyper_connection.hc_norm
    x, xn = kernels.hc_write_norm(h, e, units[: h.shape[0]], first.weight, first.eps)
    for j, (layer, layer_caches, table) in enumerate(zip(mtp.layers, caches, tables)):
        a, w = layer.attn_hyper_connection.read(x, xn if j == 0 else None)
        y = attention_step(
            layer.self_attn, a, layer_caches, at, cos, sin, model.rotary, kernels, table, once
        )
        if mixed and j + 1 == len(mtp.layers):
            then, picks = mtp.hyper_connection_mixer, None if keep is None else keep[0]
            x, xn = layer.mlp_half(x, y, w, kernels, then, picks)
        else:
            x = layer.mlp_half(x, y, w, kernels)
    return x, (xn if mixed else None)


class DraftBuffers:
    """A drafted step's static inputs and outputs for B sessions (`size`) at depth K: tok
    [B] and drafts [B, K] (views of window [B, T], T = K+1), pos [B]; out [B, 2T+1]: the T
    draws, their finite flags, the kept count; last [B, hc*H] the last kept row's residual
    (the MTP's cell at the hand-off); units [B*T, hc] ones (the MTP cells' sums as
    hyper-connection writes of unit weights: runner/draft_step.cells). Graphed: `table`
    [keys, B*(T+1), TABLE_WIDTH] names the sessions from the anchor, then each session once
    per window row (runner/lone_buffers.SizeTables.of, `draft_keys`), written before a call."""

    def __init__(self, b: int, depth: int, hc: int, width: int, dtype, device: torch.device):
        on = dict(dtype=torch.long, device=device)
        t = depth + 1
        self.size, self.depth = b, depth
        self.table: torch.Tensor | None = None
        self.table_keys: list = []
        # the window [B, T]: the pending token, then the drafts (views: a step reads the
        # window with no cat)
        self.window = torch.zeros(b, t, **on)
        self.tok, self.drafts = self.window[:, 0], self.window[:, 1:]
        self.pos = torch.zeros(b, **on)
        self.firsts = torch.arange(b, **on) * t  # each session's first row among the B*T
        self.marks = torch.zeros(3, b, **on)  # kept, kept - 1, the last kept row (of B*T)
        self.out = torch.zeros(b, 2 * t + 1, **on)
        self.last = torch.zeros(b, width, dtype=dtype, device=device)
        self.units = torch.ones(b * t, hc, dtype=dtype, device=device)
        self.ring = torch.zeros(
            RING, b, 2 * t + 1, dtype=torch.long, pin_memory=device.type == "cuda"
        )
        self.warm = False

    def key(self, ids: tuple[int, ...]) -> tuple:
        return ("draft", self.depth, "size", self.size)

    def inputs(self) -> tuple[torch.Tensor, ...]:
        return self.tok, self.pos, self.drafts

    def pad_table(self, tables) -> torch.Tensor:
        return tables.of((), self.size, self.depth)

    def tables(self) -> dict:
        """The sessions' tables by key [B, TABLE_WIDTH], and by ("rows", key) each session's
        row once per window row [B*T, TABLE_WIDTH] (runner/draft_step.py): views of `table`
        (SizeTables.of made the rows on the host: copies, since a view's rows of stride 0
        would reach the kernels, which read rows TABLE_WIDTH apart)."""
        b = self.size
        sessions, rows = self.table[:, :b], self.table[:, b:]
        rows_of = {("rows", key): r for key, r in zip(self.table_keys, rows)}
        return dict(zip(self.table_keys, sessions)) | rows_of

    def step(self, model: FlashNext, sessions: list[SessionState], tables) -> None:
        draft_step(model, sessions, self, tables)


def priced(load: float, step: float, steps: int, lefts: list, expected: list[float]) -> float:
    """ms a token of a call of up to `steps` steps that loads in `load` ms and steps in `step`,
    each stream's step giving it `expected` tokens until its reply has its `lefts`: the call
    steps until its slowest reply has them (a reply that ends rides along: run_lone)."""
    need = [math.ceil(left / e) if left < math.inf else steps for left, e in zip(lefts, expected)]
    ran = max(1, min(steps, max(need)))
    tokens = sum(min(left, ran * e) for left, e in zip(lefts, expected))
    return (load + ran * step) / max(1.0, tokens)
