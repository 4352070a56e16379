"""A drafted lone step (runner/lone_draft.py runs it): verify, acceptance, commit and the next
drafts, all on the device.

A drafted step of depth K feeds each session's window (its pending token and K drafts, at
its positions) through the model as B*(K+1) rows, draws greedily at every row, keeps the
rows up to the first draft that differs from the draw before it (kept = 1..K+1), commits the
state after the last kept row, and moves the pending token and position on. Then the MTP
head absorbs the window's cells (row i with the draw after it) and chains from the cell of
the last kept row: K new drafts for the next step. No host value enters a step.

Exactness: every op is the shared rounds' on the same rows. The window's rows write their
keys at their own positions and attend through a table that names their session once per
row (kernels.attend_sessions: each row reads its own length); the recurrent rule runs the
window's rows from the session's state (read where it lies, through the table) and keeps the
state after each, so the commit is an index put back in place (`_commit`); conv windows and
PLE ids are the inputs' tails from the kept length on. Rows past the kept ones leave keys beyond the
length (written over before any row reads them) and cells in the MTP cache past its own
(likewise). The drafts steer only how many rows a step keeps: the kept tokens are the greedy
draws of the target, so a reply is the one plain steps give (tests/runner/test_lone_draft.py,
tests/gpu/test_lone_gpu.py, tests/kernels/test_drafted_size_tables.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from flashlane.models.flashnext import FlashNext
from flashlane.models.state import GDN_CONV_COLUMN, PLE_IDS_COLUMN, SessionState
from flashlane.runner import lone_step

if TYPE_CHECKING:  # its buffers' module imports this one
    from flashlane.runner.lone_draft import DraftBuffers

__all__ = ["draft_step"]


@torch.no_grad()
def draft_step(
    model: FlashNext, sessions: list[SessionState], io: DraftBuffers, tables: dict | None
) -> None:
    """One drafted step (module docstring) of io's sessions, reading and writing io.
    `tables`: lone_step.session_tables(..., mtp=True) of the sessions, one row each (the
    window's rows get each session's row T times); None: the kernels make their own and the
    states are stacked (eager steps)."""
    cfg, kernels = model.cfg, model.kernels
    tables = tables or {}
    b, k = io.drafts.shape
    t = k + 1

    def rows_of(key):  # a session table with each session's row once per window row
        if ("rows", key) in tables:  # DraftBuffers.tables: made on the host
            return tables[("rows", key)]
        table = tables.get(key)  # (a copy: the kernels read rows TABLE_WIDTH apart)
        return (
            None if table is None else table[:, None].expand(-1, t, -1).contiguous().flatten(0, 1)
        )

    window = io.window  # [B, T]: tok and drafts are its views
    # as a plain step (lone_step.step): the first read's norm in the embedding's launch, the
    # rows' angles and attention_once's tensors in one (with `at`, each row's position
    # io.pos + j), each read's norm in the write before
    r, xn = lone_step.embedded(model, window.flatten())
    at = torch.empty(b * t, dtype=io.pos.dtype, device=io.pos.device)  # [B*T]
    inv = model.rotary.inv(at.device)
    cos, sin, *once = kernels.step_angles(io.pos, inv, r.dtype, cfg.indexer_block, window=at)
    # (table, a layer's puts: (states, rows of the window [B, T+tail, ...] or None, states
    # after each row or None, column)): what _commit puts back
    pending = []
    for idx, layer in enumerate(model.layers):
        if layer.ple is not None:
            states = [s.ple[idx] for s in sessions]
            table = tables.get(("ple", idx))
            r = _ple(layer.ple, r.view(b, t, -1), states, window, kernels, pending, table)
        a, w = layer.attn_hyper_connection.read(r, xn)
        if layer.kind == "linear":
            states = [s.gdn[idx] for s in sessions]
            y = _gdn(layer.linear_attn, a.view(b, t, -1), states, kernels, pending, tables.get(idx))
        else:
            caches = [s.attn[idx] for s in sessions for _ in range(t)]
            y = lone_step.attention_step(
                layer.self_attn, a, caches, at, cos, sin, model.rotary, kernels, rows_of(idx), once
            )
        r, xn = lone_step.mlp_half(model, idx, r, y, w)
    # each row's draw (the first maximum, ties to the lower id: bf16 logits hold the fp32
    # ones' order) into ids, the kept rows (1..T), the host's verdict, the pending token and
    # position moved on: kept, kept - 1 and each session's last kept row among the B*T in
    # io.marks, all in one launch
    ids = torch.empty(b * t, dtype=io.pos.dtype, device=io.pos.device)  # [B*T]
    logits = model.head_logits(r, xn)
    kernels.accept_window(logits, io.drafts, io.firsts, io.out, io.tok, io.pos, io.marks, ids)
    kept, last, rows = io.marks
    _commit(pending, kept, last, kernels)
    heads = range(len(model.mtp.layers))
    mtp_tables = ([rows_of(("mtp", j)) for j in heads], [tables.get(("mtp", j)) for j in heads])
    angles = (at, cos, sin, once)
    _draft_next(model, sessions, io, r, ids, angles, rows, mtp_tables)


def _gathered(kernels, tensors, table, column, tail=None) -> torch.Tensor:
    """The sessions' buffers stacked [B, ...] (then `tail` [B, m, ...] along dim 1): through
    the table (the anchor's offsets) in one launch, or stacked as they are (one session: a
    view)."""
    if table is None:
        stacked = lone_step.stacked(tensors)
        return stacked if tail is None else torch.cat([stacked, tail], dim=1)
    return kernels.gather_sessions(tensors, table, column, tail=tail)


def _ple(ple, r3, states, window, kernels, pending, table) -> torch.Tensor:
    ids, conv = [p.ids for p in states], [p.conv for p in states]
    history = _gathered(kernels, ids, table, PLE_IDS_COLUMN, tail=window)  # ids, then window
    # r3 plus the addition in one launch (kernels.ple_add, the same bits as the two adds);
    # the conv reads each session's window where it lies (its table's column 0)
    if table is None:
        stacked = lone_step.stacked(conv)
        added, xfull = ple.stacked(r3, history, stacked, kernels, added=True)
    else:
        added, xfull = ple.stacked(r3, history, conv[0][None], kernels, added=True, table=table)
    pending.append((table, [(conv, xfull, None, 0), (ids, history, None, PLE_IDS_COLUMN)]))
    return added.flatten(0, 1)


def _gdn(gdn, a3, states, kernels, pending, table) -> torch.Tensor:
    b, t = a3.shape[:2]
    convs, recurrents = [g.conv for g in states], [g.recurrent for g in states]
    qkv, gate_a, gate_b, z = gdn.project(a3.flatten(0, 1))
    qkv, gate_a, gate_b = (x.unflatten(0, (b, t)) for x in (qkv, gate_a, gate_b))
    if table is None:
        q, k, v, xfull = gdn.conv_qkv(qkv, lone_step.stacked(convs), kernels)
    else:  # the conv reads each session's window where it lies (its table's conv column)
        y, xfull = kernels.causal_conv(qkv, convs[0][None], gdn.conv_weight, table=table)
        q, k, v = gdn.heads(y, kernels)
    gates = gdn.gates(gate_a, gate_b)
    if table is None:
        state = lone_step.stacked(recurrents)
        o, after = kernels.recurrent_gdn(q, k, v, None, None, state, gates=gates)
    else:  # each session's state read where it lies (and moved on to the window's last row,
        # which the commit replaces by the kept row's); the state after every row in `after`
        s = recurrents[0]
        after = torch.empty((b, t, *s.shape), dtype=s.dtype, device=s.device)
        o = kernels.gdn_sessions(q, k, v, None, None, recurrents, table, gates, after)
    pending.append((table, [(convs, xfull, None, GDN_CONV_COLUMN), (recurrents, None, after, 0)]))
    return gdn.finish(o.flatten(0, 1), z)


def _commit(pending, kept: torch.Tensor, last: torch.Tensor, kernels) -> None:
    """Each session's state after its kept rows (kernels.put_sessions_from, through the
    table where there is one): a tail of inputs (conv windows, PLE ids) from row kept on, or
    the recurrent state after row kept - 1 (`last`). A layer's two puts are one launch."""
    for table, puts in pending:
        (states, src, start, rows, column), *also = [_put(p, kept, last) for p in puts]
        also = also[0] if also else None
        kernels.put_sessions_from(states, src, start, rows, table, column, also=also)


def _put(put, kept: torch.Tensor, last: torch.Tensor) -> tuple:
    """A pending put's (states, src, start, rows, column) for kernels.put_sessions_from."""
    states, inputs, after, column = put
    if after is not None:
        return states, after.contiguous(), last, 1, column
    return states, inputs.contiguous(), kept, states[0].shape[0], column


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
    cells = (window_caches, angles, window_tables, io.units, True)
    x, xn = _cells(model, r, next_ids, *cells, keep=(rows, io.last))
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
            x, xn = _cells(model, x, io.drafts[:, d], caches, angles, chain, io.units, True, picked)
            picked = None


def _cells(
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
        y = lone_step.attention_step(
            layer.self_attn, a, layer_caches, at, cos, sin, model.rotary, kernels, table, once
        )
        if mixed and j + 1 == len(mtp.layers):
            then, picks = mtp.hyper_connection_mixer, None if keep is None else keep[0]
            x, xn = layer.mlp_half(x, y, w, kernels, then, picks)
        else:
            x = layer.mlp_half(x, y, w, kernels)
    return x, (xn if mixed else None)
