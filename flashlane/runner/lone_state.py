"""Where a device step's mixers read and write session state: runner/trunk.py's `layer`
runs the target's layers in runner/lone_step.py's plain steps with `InPlace` and in
runner/draft_step.py's drafted ones with `Windowed`.

A step feeds B sessions a window of T rows each (a plain step: the pending token, T = 1; a
drafted step: the pending token and K drafts, T = K + 1), every op the shared rounds' on the
same rows, so the bits are theirs. The step is one CUDA graph (runner/lone.py,
runner/lone_draft.py), so its layers' parts are called as they are (`run`). The two states
differ only in where a mixer's session state goes:

- `InPlace` (T = 1): each session's PLE ids and conv window, GDN conv window and recurrent
  state are read and written where they lie (one session as views; several through their
  tables, or stacked copies put back).
- `Windowed` (T = K + 1): read where they lie, and kept per row (the conv windows' inputs,
  the recurrent state after every row) until the step knows how many rows it keeps:
  `Windowed.commit` puts the kept row's state back, in one launch a layer.

Attention writes every row's key at its own position in both (a row past the kept ones leaves
a key beyond the session's length, written over before any row reads it).
"""

from __future__ import annotations

import torch

from flashlane.models.rows import copy_all
from flashlane.models.state import GDN_CONV_COLUMN, PLE_IDS_COLUMN, SessionState

__all__ = ["InPlace", "Windowed", "attention_once", "attention_step", "stacked"]


class Step:
    """What both states hold: the sessions, their `tables` (by layer index; none: the kernels
    make their own, states stacked), the rows' positions at [B*T] and angles (cos, sin,
    attention_once's tensors) from kernels.step_angles."""

    def __init__(self, sessions: list[SessionState], tables: dict, at: torch.Tensor, angles):
        self.sessions, self.tables, self.at, self.angles = sessions, tables, at, angles

    @staticmethod
    def run(key, fn, *args: torch.Tensor, views: int = 0) -> tuple:
        """A part called as it is (the whole step is one graph)."""
        return fn(*args)

    def cos_sin(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return self.angles[0], self.angles[1]

    def windows(self, gdn) -> None:
        """No stacked conv windows: the conv reads each session's where it lies."""
        return None

    def attend(self, idx: int, attn, q, k, v, iq, raw, kernels) -> torch.Tensor:
        """Each row's attention over its own session's cache (`attend_sessions`) -> o."""
        caches, table = self.attention(idx)
        return attend_sessions(
            attn, q, k, v, iq, raw, caches, self.at, kernels, table, self.angles[2]
        )

    def attention(self, idx: int) -> tuple[list, torch.Tensor | None]:
        """Layer idx's caches, one a row's session, and their table."""
        raise NotImplementedError


class InPlace(Step):
    """A plain step's session state (T = 1, module docstring): `tables` from
    lone_step.session_tables, or none; tok [B] the rows' tokens (the PLE's ids move on by
    them); at, angles: `Step`'s."""

    def __init__(self, sessions: list[SessionState], tables: dict, tok: torch.Tensor, at, angles):
        super().__init__(sessions, tables, at, angles)
        self.tok = tok

    def attention(self, idx: int) -> tuple[list, torch.Tensor | None]:
        return [s.attn[idx] for s in self.sessions], self.tables.get(idx)

    def ple(self, idx: int, layer, r: torch.Tensor, kernels) -> torch.Tensor:
        """r plus layer idx's PLE addition; the sessions' PLE ids and conv windows moved on."""
        ple = layer.ple
        # one session: its ids move on and the conv moves its window in place (views);
        # several: stacked copies, copied back (through the table where given)
        states, tok = [s.ple[idx] for s in self.sessions], self.tok
        table = self.tables.get(("ple", idx))
        if table is not None:
            ids = kernels.gather_sessions([p.ids for p in states], table, PLE_IDS_COLUMN)
            window = kernels.gather_sessions([p.conv for p in states], table, 0)
            history = torch.cat([ids, tok[:, None]], dim=1)
            added, xfull = ple.stacked(r[:, None], history, window, kernels, added=True)
            kernels.put_sessions([p.ids for p in states], history[:, 1:], table, PLE_IDS_COLUMN)
            kernels.put_sessions([p.conv for p in states], xfull[:, 1:], table, 0)
            return added[:, 0]
        one = len(states) == 1
        if one:
            history = kernels.push_history(states[0].ids[None], tok)
        else:
            history = torch.cat([stacked([p.ids for p in states]), tok[:, None]], dim=1)
        conv = stacked([p.conv for p in states])
        added, xfull = ple.stacked(r[:, None], history, conv, kernels, shift=one, added=True)
        if not one:
            ids, convs = [p.ids for p in states], [p.conv for p in states]
            copy_all(ids + convs, [*history[:, 1:], *xfull[:, 1:]])
        return added[:, 0]

    def gdn(self, idx: int, gdn, qkv, gate_a, gate_b, kernels) -> torch.Tensor:
        """GDN layer idx's conv and recurrent rule over the rows' projections -> o [B, HV, Dv]."""
        states, table = [s.gdn[idx] for s in self.sessions], self.tables.get(idx)
        gates = gdn.gates(gate_a[:, None], gate_b[:, None])  # computed in the rule's programs
        # the conv moves each window past the row, and the rule updates each recurrent
        # state, in place: one session's as views, several (or one with a table) through
        # the table
        if len(states) == 1 and table is None:
            conv = states[0].conv[None]
            y, _ = kernels.causal_conv(qkv[:, None], conv, gdn.conv_weight, shift=True)
            q, k, v = gdn.heads(y, kernels)
            s = states[0].recurrent  # the kernel reads each tile before it writes it
            o, _ = kernels.recurrent_gdn(
                q, k, v, None, None, s[None], out=s[None, None], gates=gates
            )
        else:
            convs = [g.conv for g in states]
            y, _ = kernels.conv_sessions(qkv[:, None], convs, gdn.conv_weight, table)
            q, k, v = gdn.heads(y, kernels)
            recurrents = [g.recurrent for g in states]
            o = kernels.gdn_sessions(q, k, v, None, None, recurrents, table, gates=gates)
        return o[:, 0]


class Windowed(Step):
    """A drafted step's session state (T = K + 1, module docstring): window [B, T] the rows'
    tokens; `tables` one row a session (lone_step.session_tables), and by ("rows", key) each
    session's row once per window row (made on the host: DraftBuffers.tables), or none (the
    kernels make their own, states stacked: eager steps). `pending`: (table, a layer's puts:
    (states, rows of the window [B, T+tail, ...] or None, states after each row or None,
    column)), what `commit` puts back. at, angles: `Step`'s."""

    def __init__(
        self, sessions: list[SessionState], tables: dict, window: torch.Tensor, at, angles
    ):
        super().__init__(sessions, tables, at, angles)
        self.window = window
        self.b, self.t = window.shape  # (with an anchor's tables, sessions may be the anchor)
        self.pending: list = []

    def rows_of(self, key) -> torch.Tensor | None:
        """The session table of `key` with each session's row once per window row."""
        if ("rows", key) in self.tables:  # DraftBuffers.tables: made on the host
            return self.tables[("rows", key)]
        table = self.tables.get(key)  # (a copy: the kernels read rows TABLE_WIDTH apart)
        if table is None:
            return None
        return table[:, None].expand(-1, self.t, -1).contiguous().flatten(0, 1)

    def attention(self, idx: int) -> tuple[list, torch.Tensor | None]:
        return [s.attn[idx] for s in self.sessions for _ in range(self.t)], self.rows_of(idx)

    def ple(self, idx: int, layer, r: torch.Tensor, kernels) -> torch.Tensor:
        """r plus layer idx's PLE addition; the window's conv inputs and ids kept."""
        ple = layer.ple
        states, table = [s.ple[idx] for s in self.sessions], self.tables.get(("ple", idx))
        r3 = r.view(self.b, self.t, -1)
        ids, conv = [p.ids for p in states], [p.conv for p in states]
        history = _gathered(kernels, ids, table, PLE_IDS_COLUMN, tail=self.window)
        # r3 plus the addition in one launch (kernels.ple_add, the same bits as the two
        # adds); the conv reads each session's window where it lies (its table's column 0)
        if table is None:
            added, xfull = ple.stacked(r3, history, stacked(conv), kernels, added=True)
        else:
            added, xfull = ple.stacked(r3, history, conv[0][None], kernels, added=True, table=table)
        puts = [(conv, xfull, None, 0), (ids, history, None, PLE_IDS_COLUMN)]
        self.pending.append((table, puts))
        return added.flatten(0, 1)

    def gdn(self, idx: int, gdn, qkv, gate_a, gate_b, kernels) -> torch.Tensor:
        """GDN layer idx's conv and recurrent rule over the window's projections -> o
        [B*T, HV, Dv]; the conv inputs and the state after every row kept."""
        states, table = [s.gdn[idx] for s in self.sessions], self.tables.get(idx)
        b, t = self.b, self.t
        convs, recurrents = [g.conv for g in states], [g.recurrent for g in states]
        qkv, gate_a, gate_b = (x.unflatten(0, (b, t)) for x in (qkv, gate_a, gate_b))
        if table is None:
            q, k, v, xfull = gdn.conv_qkv(qkv, stacked(convs), kernels)
        else:  # the conv reads each session's window where it lies (its table's conv column)
            y, xfull = kernels.causal_conv(qkv, convs[0][None], gdn.conv_weight, table=table)
            q, k, v = gdn.heads(y, kernels)
        gates = gdn.gates(gate_a, gate_b)
        if table is None:
            o, after = kernels.recurrent_gdn(q, k, v, None, None, stacked(recurrents), gates=gates)
        else:  # each session's state read where it lies (and moved on to the window's last
            # row, which the commit replaces by the kept row's); every row's state in `after`
            s = recurrents[0]
            after = torch.empty((b, t, *s.shape), dtype=s.dtype, device=s.device)
            o = kernels.gdn_sessions(q, k, v, None, None, recurrents, table, gates, after)
        puts = [(convs, xfull, None, GDN_CONV_COLUMN), (recurrents, None, after, 0)]
        self.pending.append((table, puts))
        return o.flatten(0, 1)

    def commit(self, kept: torch.Tensor, last: torch.Tensor, kernels) -> None:
        """Each session's state after its kept rows (kernels.put_sessions_from, through the
        table where there is one): a tail of inputs (conv windows, PLE ids) from row kept on,
        or the recurrent state after row kept - 1 (`last`). A layer's two puts are one
        launch."""
        for table, puts in self.pending:
            (states, src, start, rows, column), *also = [_put(p, kept, last) for p in puts]
            also = also[0] if also else None
            kernels.put_sessions_from(states, src, start, rows, table, column, also=also)


def _put(put, kept: torch.Tensor, last: torch.Tensor) -> tuple:
    """A pending put's (states, src, start, rows, column) for kernels.put_sessions_from."""
    states, inputs, after, column = put
    if after is not None:
        return states, after.contiguous(), last, 1, column
    return states, inputs.contiguous(), kept, states[0].shape[0], column


def _gathered(kernels, tensors, table, column, tail=None) -> torch.Tensor:
    """The sessions' buffers stacked [B, ...] (then `tail` [B, m, ...] along dim 1): through
    the table (the anchor's offsets) in one launch, or stacked as they are (one session: a
    view)."""
    if table is None:
        both = stacked(tensors)
        return both if tail is None else torch.cat([both, tail], dim=1)
    return kernels.gather_sessions(tensors, table, column, tail=tail)


def stacked(xs: list[torch.Tensor]) -> torch.Tensor:
    """[B, ...] of the sessions' tensors (one session: a view, no copy)."""
    return xs[0][None] if len(xs) == 1 else torch.stack(xs)


def attention_step(attn, a, caches: list, pos, cos, sin, rotary, kernels, table, once=None):
    """One attention layer over rows at positions pos, each reading and writing its own
    session's cache (`attend_sessions`), from its input a to its output (the MTP head's
    cells, runner/draft_step.py). once: `attention_once`'s tensors, made once for every
    attention layer of the step."""
    q, gate, k, v, iq, raw = attn.project(a, cos, sin)
    once = once or attention_once(attn.cfg, rotary, pos, caches[0].block_keys.dtype)
    return attn.output(
        attend_sessions(attn, q, k, v, iq, raw, caches, pos, kernels, table, once), gate
    )


def attend_sessions(
    attn, q, k, v, iq, raw, caches: list, pos, kernels, table, once
) -> torch.Tensor:
    """Each row's keys written to its own session's cache at pos and its attention over
    them (kernels.attend_sessions) -> o [N, Hq, D]; once: `attention_once`'s tensors."""
    cfg, norm = attn.cfg, attn.indexer.k_layernorm
    bcos, bsin, lengths = once
    return kernels.attend_sessions(
        q,
        k,
        v,
        iq,
        raw,
        caches,
        pos,
        bcos,
        bsin,
        norm.weight,
        norm.eps,
        cfg.indexer_block,
        cfg.indexer_top_blocks,
        cfg.head_dim**-0.5,
        table,
        lengths=lengths,
    )


def attention_once(cfg, rotary, pos: torch.Tensor, dtype: torch.dtype) -> tuple:
    """What every attention layer of a step reads alike: cos / sin of each row's block's
    first position (for pooling the block again) and the rows' cache lengths pos + 1."""
    return (*rotary.cos_sin(pos, dtype, cfg.indexer_block), pos + 1)
