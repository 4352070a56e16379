"""Drafted lone steps: verify, acceptance, commit and the next drafts, all on the device.

A drafted step of depth K feeds each session's window (its pending token and K drafts, at
its positions) through the model as B*(K+1) rows, draws greedily at every row, keeps the
rows up to the first draft that differs from the draw before it (kept = 1..K+1), commits the
state after the last kept row, and moves the pending token and position on. Then the MTP
head absorbs the window's cells (row i with the draw after it) and chains from the cell of
the last kept row: K new drafts for the next step. No host value enters a step, so one CUDA
graph per (K, batch size) replays it for any sessions, named by the size tables from the
anchor session (runner/lone_buffers.py), two in flight, as plain lone steps do
(runner/lone.py).

Exactness: every op is the shared rounds' on the same rows. The window's rows write their
keys at their own positions and attend through a table that names their session once per
row (kernels.attend_sessions: each row reads its own length); the recurrent rule runs the
window's rows from the session's state (gathered through the table) and keeps the state after
each, so the commit is an index put back in place (`_commit`); conv windows and PLE ids are
the inputs' tails from the kept length on.
Rows past the kept ones leave keys beyond the length (written over before any row reads
them) and cells in the MTP cache past its own (likewise). The drafts steer only how many
rows a step keeps: the kept tokens are the greedy draws of the target, so a reply is the
one plain steps give (tests/runner/test_lone_draft.py, tests/gpu/test_lone_gpu.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from flashlane.drafting.mtp import Waiting
from flashlane.lanes.stream import DraftStats
from flashlane.models.flashnext import FlashNext
from flashlane.models.rows import copy_all
from flashlane.models.state import GDN_CONV_COLUMN, PLE_IDS_COLUMN, SessionState
from flashlane.runner import lone, lone_step
from flashlane.runner.lone_buffers import RING

DEPTH = 2  # drafts a drafted step carries (the embedded model lands ~3 in 4 at depth 1)
PROBE_EVERY = 8  # calls between tries of the kind measured slower
# the most sessions a drafted step takes: past it a step's B*(K+1) rows read most experts
# (plain steps are measured to win there), and each size is one more graph to capture
MAX_STREAMS = 16
# drafted steps of up to this many sessions are captured at engine start; larger ones when
# first chosen
EAGER_STREAMS = 4


class Drafting:
    """The lone driver's drafted steps: whether a call drafts (`choose`) and the drafted
    decode loop (`decode`), two steps in flight as plain ones."""

    def __init__(self, driver: lone.LoneDriver, depth: int = DEPTH):
        self.driver, self.depth = driver, depth
        self.stats = DraftStats()  # landing per depth over every drafted step
        self.num_calls = 0
        self.num_drafted = self.num_landed = 0
        self.landed: list[int] = []  # drafts landed per session in the last call
        self.num_carried = 0  # calls that went on from the device's drafts (`carry`)
        # stream id -> ((session, position, pending token), buffers, row): where a drafted
        # call left the stream's pending token and drafts on the device; a later call from
        # there (with these streams or a few of them) takes them over without the host
        self.carry: dict[int, tuple[tuple[int, int, int], DraftBuffers, int]] = {}

    def choose(self, ids: list[int]) -> int:
        """The depth, or 0 (plain steps), for a call of these sessions: drafts while a
        drafted step's expected tokens per ms beat a plain step's, both measured as the
        steps run (driver.step_ms); the kind measured slower is tried again every
        PROBE_EVERY calls (landing drifts with the text). More than MAX_STREAMS: plain."""
        self.num_calls += 1
        if len(ids) > MAX_STREAMS:
            return 0
        return self._better(len(ids))

    def eager_sizes(self) -> list[int]:
        """The sizes whose drafted step is captured at engine start."""
        return [n for n in self.driver.sizes if n <= EAGER_STREAMS]

    def _better(self, b: int) -> int:
        measured = {n for n, d in self.driver.step_ms if d == 0}
        measured &= {n for n, d in self.driver.step_ms if d == self.depth}
        # steps of a few sessions cost about the same: the nearest count measured stands in
        near = min(measured, key=lambda n: (abs(n - b), n), default=b)
        plain, drafted = (self.driver.step_ms.get((near, d)) for d in (0, self.depth))
        if drafted is None or plain is None:
            return 0 if drafted is not None else self.depth
        landing, expected = 1.0, 1.0
        for d in range(1, self.depth + 1):
            landing *= self.stats.rate(d)
            expected += landing
        better = self.depth if expected / drafted > 1 / plain else 0
        if self.num_calls % PROBE_EVERY == 0:
            return self.depth - better
        return better

    def decode(
        self,
        ids: list[int],
        tokens: list[int],
        positions: list[int],
        budget: int,
        room: int,
        takes: list[Callable[[int, bool], bool]],
        stream_ids: list[int],
        draws: list,
    ) -> int | None:
        """LoneDriver.decode_many in drafted steps: up to `budget` steps while each fits in
        `room` positions; every landed step's kept tokens go to the takes in order. Returns
        the steps launched (None: no step fits, nothing ran)."""
        drv, depth = self.driver, self.depth
        t = depth + 1
        budget = min(budget, room // t, drv.max_steps)
        if drv.size_tables is not None:  # the pad rows' room, from position 0
            budget = min(budget, drv.size_tables.pad.capacity // t - 1)
        if budget <= 0:
            return None
        b = len(ids)
        io = drv.buffers(b, depth)
        if io.table is not None:  # rows past b: the pad session's
            io.table.copy_(drv.size_tables.of(tuple(ids), io.size, drafted=True), non_blocking=True)
        self._load(io, ids, tokens, positions, stream_ids, draws)
        kept, last = [0] * b, list(tokens)
        self.landed = [0] * b

        def land(rows: list[list[int]]) -> bool:
            going = True
            for i, row in enumerate(rows[:b]):
                n = row[2 * t]
                self.stats.record([1.0] * depth, n - 1)
                self.num_drafted += depth
                self.num_landed += n - 1
                self.landed[i] += n - 1
                kept[i] += n
                last[i] = row[n - 1]
                for j in range(n):
                    going = takes[i](row[j], bool(row[t + j])) and going
            return going

        launched = drv.run_steps(tuple(ids), io, budget, land)
        after = [p + n for p, n in zip(positions, kept)]
        self.carry = {sid: c for sid, c in self.carry.items() if c[1] is not io}
        self.carry.update(
            {sid: ((ids[i], after[i], last[i]), io, i) for i, sid in enumerate(stream_ids)}
        )
        self._hand_off(ids, after, last, io, stream_ids, draws)
        return launched

    def _load(self, io, ids, tokens, positions, stream_ids, draws) -> None:
        """io's pending tokens, positions and drafts: where every session goes on from a
        drafted call's carry, copied on the device; else from the host (the host drafter's
        chain for the first drafts)."""
        drv, carry = self.driver, [self.carry.get(sid) for sid in stream_ids]
        b, where = len(ids), list(zip(ids, positions, tokens))
        if all(
            c is not None and c[0] == w and c[1].depth == io.depth for c, w in zip(carry, where)
        ):
            if any(src is not io or row != i for i, (_, src, row) in enumerate(carry)):
                froms = {id(src): [x.clone() for x in src.inputs()] for _, src, _ in carry}
                for i, (_, src, row) in enumerate(carry):
                    for dst, x in zip(io.inputs(), froms[id(src)]):
                        dst[i].copy_(x[row])
            for x in io.inputs():  # the pad rows from position 0 again
                x[b:].zero_()
            self.num_carried += 1
            return
        first = self._first_drafts(ids, stream_ids, draws) + [[0] * self.depth] * (io.size - b)
        pad = [0] * (io.size - b)
        pinned = torch.tensor([[*tokens, *pad], [*positions, *pad]], pin_memory=drv.is_cuda)
        io.tok.copy_(pinned[0], non_blocking=True)
        io.pos.copy_(pinned[1], non_blocking=True)
        io.drafts.copy_(torch.tensor(first, pin_memory=drv.is_cuda), non_blocking=True)

    def _first_drafts(self, ids, stream_ids, draws) -> list[list[int]]:
        """The host drafter's chain for each stream (its head absorbs every waiting cell
        first), padded to the depth (a padded draft is one more that does not land)."""
        drafter, sessions = self.driver.drafter, self.driver.sessions
        got = drafter.draft(
            {s: self.depth for s in stream_ids}, {s: sessions[i] for s, i in zip(stream_ids, ids)}
        )
        return [(d.tokens + [0] * self.depth)[: self.depth] for d in got]

    def _hand_off(self, ids, after, last, io, stream_ids, draws) -> None:
        """Sessions and MTP queues as shared rounds would take them: each session at its kept
        length, its head's cache valid below the last kept row, whose cell (with the pending
        token) waits in the drafter's queue (absorbing it again writes the same cell)."""
        drafter = self.driver.drafter
        for i, sid in enumerate(ids):
            s = self.driver.sessions[sid]
            s.length = after[i]
            s.mtp_length = after[i] - 1
            drafter.waiting[stream_ids[i]] = Waiting(
                [io.last[i : i + 1].clone()], [last[i]], False, draws[i]
            )


class DraftBuffers:
    """A drafted step's static inputs and outputs for B sessions (`size`) at depth K: tok
    [B], drafts [B, K], pos [B]; out [B, 2T+1] (T = K+1): the T draws, their finite flags,
    the kept count; last [B, hc*H] the last kept row's residual (the MTP's cell at the
    hand-off). Graphed: `table` [keys, B, TABLE_WIDTH] names the sessions from the anchor
    (runner/lone_buffers.SizeTables, `draft_keys`), written before a call."""

    def __init__(self, b: int, depth: int, width: int, dtype, device: torch.device):
        on = dict(dtype=torch.long, device=device)
        t = depth + 1
        self.size, self.depth = b, depth
        self.table: torch.Tensor | None = None
        self.table_keys: list = []
        self.tok, self.pos = torch.zeros(b, **on), torch.zeros(b, **on)
        self.drafts = torch.zeros(b, depth, **on)
        self.offsets = torch.arange(t, **on)
        self.out = torch.zeros(b, 2 * t + 1, **on)
        self.last = torch.zeros(b, width, dtype=dtype, device=device)
        self.ring = torch.zeros(
            RING, b, 2 * t + 1, dtype=torch.long, pin_memory=device.type == "cuda"
        )
        self.warm = False

    def key(self, ids: tuple[int, ...]) -> tuple:
        return ("draft", self.depth, "size", self.size)

    def inputs(self) -> tuple[torch.Tensor, ...]:
        return self.tok, self.pos, self.drafts

    def tables(self) -> dict:
        return dict(zip(self.table_keys, self.table))

    def step(self, model: FlashNext, sessions: list[SessionState], tables) -> None:
        draft_step(model, sessions, self, tables)


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
        table = tables.get(key)  # (a copy: the kernels read rows TABLE_WIDTH apart)
        return (
            None if table is None else table[:, None].expand(-1, t, -1).contiguous().flatten(0, 1)
        )

    window = torch.cat([io.tok[:, None], io.drafts], dim=1)  # [B, T]
    at = (io.pos[:, None] + io.offsets).flatten()  # [B*T] each row's position
    # as a plain step (lone_step.step): the first read's norm in the embedding's launch, the
    # rows' angles and attention_once's tensors in one, each read's norm in the write before
    r, xn = lone_step.embedded(model, window.flatten())
    cos, sin, *once = kernels.step_angles(
        at, model.rotary.inv(at.device), r.dtype, cfg.indexer_block
    )
    # (states, rows of the window [B, T+tail, ...] or None, states after each row or None,
    # table, column): what _commit puts back
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
    # the first maximum (ties to the lower id); bf16 logits hold the fp32 ones' order
    top, ids = model.head_logits(r, xn).max(dim=1)
    # finite: |top| < inf is false for NaN and both infinities, in two launches
    ids, finite = ids.view(b, t), (top.abs() < float("inf")).view(b, t)
    lands = (io.drafts == ids[:, :k]) & finite[:, :k]
    kept = 1 + lands.long().cumprod(dim=1).sum(dim=1)  # [B] rows kept, 1..T
    last = kept - 1
    every = torch.arange(b, device=ids.device)
    _commit(pending, kept, every, kernels)
    torch.cat([ids, finite, kept[:, None]], dim=1, out=io.out)
    io.last.copy_(r.view(b, t, -1)[every, last])
    io.tok.copy_(ids[every, last])
    heads = range(len(model.mtp.layers))
    mtp_tables = ([rows_of(("mtp", j)) for j in heads], [tables.get(("mtp", j)) for j in heads])
    angles = (at, cos, sin, once)
    _draft_next(model, sessions, io, r, ids.flatten(), angles, every * t + last, mtp_tables)
    io.pos.add_(kept)


def _gathered(kernels, tensors, table, column) -> torch.Tensor:
    """The sessions' buffers stacked [B, ...]: through the table (the anchor's offsets), or
    stacked as they are (one session: a view)."""
    if table is None:
        return lone_step.stacked(tensors)
    return kernels.gather_sessions(tensors, table, column)


def _ple(ple, r3, states, window, kernels, pending, table) -> torch.Tensor:
    ids, conv = [p.ids for p in states], [p.conv for p in states]
    history = torch.cat([_gathered(kernels, ids, table, PLE_IDS_COLUMN), window], dim=1)
    add, xfull = ple.stacked(r3, history, _gathered(kernels, conv, table, 0), kernels)
    pending.append((conv, xfull, None, table, 0))
    pending.append((ids, history, None, table, PLE_IDS_COLUMN))
    return (r3 + add).flatten(0, 1)


def _gdn(gdn, a3, states, kernels, pending, table) -> torch.Tensor:
    b, t = a3.shape[:2]
    convs, recurrents = [g.conv for g in states], [g.recurrent for g in states]
    qkv, gate_a, gate_b, z = gdn.project(a3.flatten(0, 1))
    qkv, gate_a, gate_b = (x.unflatten(0, (b, t)) for x in (qkv, gate_a, gate_b))
    window = _gathered(kernels, convs, table, GDN_CONV_COLUMN)
    q, k, v, xfull = gdn.conv_qkv(qkv, window, kernels)
    o, after = kernels.recurrent_gdn(
        q,
        k,
        v,
        None,
        None,
        _gathered(kernels, recurrents, table, 0),
        gates=gdn.gates(gate_a, gate_b),
    )
    pending.append((convs, xfull, None, table, GDN_CONV_COLUMN))
    pending.append((recurrents, None, after, table, 0))
    return gdn.finish(o.flatten(0, 1), z)


def _commit(pending, kept: torch.Tensor, every: torch.Tensor, kernels) -> None:
    """Each session's state after its kept rows: a tail of inputs (conv windows, PLE ids)
    from index kept on, or the recurrent state after row kept-1 (`every`: arange(B)), put
    back through the table where there is one."""
    dsts, srcs, last, spans = [], [], kept - 1, {}
    for states, inputs, after, table, column in pending:
        if after is not None:
            chosen = after[every, last]
        else:
            n = states[0].shape[0]  # the tail's length: kept .. kept + n - 1, made once
            if n not in spans:
                spans[n] = kept[:, None] + torch.arange(n, device=kept.device)
            span = spans[n]
            index = span.view(*span.shape, *[1] * (inputs.dim() - 2))
            chosen = inputs.gather(1, index.expand(-1, -1, *inputs.shape[2:]))
        if table is not None:
            kernels.put_sessions(states, chosen, table, column)
        else:
            dsts += states
            srcs += list(chosen.to(states[0].dtype))
    copy_all(dsts, srcs)


def _draft_next(model, sessions, io, r, next_ids, angles, rows, tables) -> None:
    """The MTP head absorbs the window's cells (row i with the draw after it, at row i's
    position) and chains K drafts from the cell of each session's last kept row (`rows`).
    angles: the window rows' (positions, cos, sin, attention_once's); tables: (each head
    layer's table of the window's rows, of the sessions)."""
    mtp, k, cfg = model.mtp, io.drafts.shape[1], model.cfg
    heads = range(len(mtp.layers))
    window_tables, chain = tables
    window_caches = [[s.mtp[j] for s in sessions for _ in range(k + 1)] for j in heads]
    x = _cells(model, r, next_ids, window_caches, angles, window_tables)
    x, pos = x[rows], io.pos + io.out[:, 2 * (k + 1)]  # the pending token's new position
    caches = [[s.mtp[j] for s in sessions] for j in heads]
    for d in range(k):
        # the first maximum; bf16 logits hold the fp32 ones' order
        io.drafts[:, d] = model.lm_head(mtp.hyper_connection_mixer.read(x)[0]).argmax(dim=1)
        if d + 1 < k:  # cell at the pending token's position: the head's residual with draft d
            at = pos + d
            c, s, *once = model.kernels.step_angles(
                at, model.rotary.inv(at.device), x.dtype, cfg.indexer_block
            )
            x = _cells(model, x, io.drafts[:, d], caches, (at, c, s, once), chain)


def _cells(model, residual, next_ids, caches, angles, tables) -> torch.Tensor:
    """MTP cells (models/layers/mtp.py) of rows at positions `at`, each reading and writing
    its own session's head cache -> the cells' output residual."""
    mtp, cfg, kernels = model.mtp, model.cfg, model.kernels
    at, cos, sin, once = angles
    e = mtp.fc_embedding(mtp.pre_fc_norm_embedding(model.embed_tokens(next_ids)))
    hn = mtp.pre_fc_norm_hidden(residual).unflatten(-1, (cfg.hc_count, cfg.hidden_size))
    x = (mtp.fc_hidden(hn) + e.unsqueeze(-2)).flatten(-2)
    for layer, layer_caches, table in zip(mtp.layers, caches, tables):
        a, w = layer.attn_hyper_connection.read(x)
        y = lone_step.attention_step(
            layer.self_attn, a, layer_caches, at, cos, sin, model.rotary, kernels, table, once
        )
        x = layer.mlp_half(x, y, w, kernels)
    return x
