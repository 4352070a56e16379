"""A lone step (runner/lone.py's LoneDriver replays it): one row per session through every
layer, each session's state read and written in place, then the next token's draw.

A step launched before the reply's end was read feeds a token the reply does not have; the
stream has ended and its session is released, so nothing reads that state. Attention reads the
whole caches with the length on the device, select_mask ranks without its host-side shortcut
(the same mask), and a block's pooled key is recomputed whenever a key is written into it
(the indexer reads it only once the block is complete). Each op is the one the shared rounds
run, on the same row, so the bits are the same, and so are sampled tokens
(tests/runner/test_lone.py, test_lone_sampled.py and test_lone_top_p.py on the CPU,
tests/gpu/test_lone_gpu.py and test_lone_sampled_gpu.py with graphs).
"""

from __future__ import annotations

import torch

from flashlane.models.flashnext import FlashNext
from flashlane.models.rows import copy_all
from flashlane.models.state import (
    PLE_IDS_COLUMN,
    AttnCache,
    GdnState,
    PleState,
    SessionState,
    attn_table,
    gdn_table,
    ple_table,
)
from flashlane.sampling.lone_draw import KeyedDraw

__all__ = [
    "attention_once",
    "attention_step",
    "gdn_step",
    "plain_step",
    "ple_step",
    "session_tables",
    "stacked",
    "step",
]


@torch.no_grad()
def step(
    model: FlashNext,
    sessions: list[SessionState],
    tok: torch.Tensor,
    pos: torch.Tensor,
    out: torch.Tensor,
    record: tuple[torch.Tensor, torch.Tensor],
    tables: dict[int, torch.Tensor] | None = None,
    draw: KeyedDraw | None = None,
    ring: torch.Tensor | None = None,
) -> None:
    """Feed tok [B] at pos [B], one row per session, commit them, and draw the tokens for
    pos + 1, greedily or with `draw` (the streams' keyed draw, sampling/lone_draw.py): out
    [B, 2] gets (the id, 1 if the row's maximum is finite; keyed: 1 for a token, else 0 and
    a failure code in the id's place), tok the ids, and pos moves on by one. The rows'
    residuals go to record = (rows [n, B, hc*H], k [1]) at rows[k], and k moves on (the MTP
    head's cells, absorbed when a stream drafts again). With `ring` [RING, B, 2] the step also
    stores out into its slot, ring[(k - 1) % RING] for the k it leaves (kernels.record_row
    with post_ring's slot: the caller's for step k - 1 of a call that set k to 0). Every op
    is the shared rounds' on the
    same rows (batched ops are row-invariant; attention, pooling and state commits read and
    write each session's own buffers: kernels.attend_sessions, with `tables` from
    session_tables, made where not given), so the bits are theirs. A sibling (Qwen3-Next,
    Qwen3.5: no hyper-connections) steps through `plain_step`."""
    if not isinstance(model, FlashNext):
        return plain_step(model, sessions, tok, pos, out, record, tables, draw, ring)
    cfg, kernels = model.cfg, model.kernels
    tables = tables or {}
    r, xn = embedded(model, tok)
    # the rows' cos / sin, and attention_once's tensors, in one launch
    cos, sin, *once = kernels.step_angles(
        pos, model.rotary.inv(pos.device), r.dtype, cfg.indexer_block
    )
    # xn: the next read's norm, where the launch before it made it
    for idx, layer in enumerate(model.layers):
        if layer.ple is not None:
            r = ple_step(
                layer.ple, r, [s.ple[idx] for s in sessions], tok, kernels, tables.get(("ple", idx))
            )
        a, w = layer.attn_hyper_connection.read(r, xn)
        if layer.kind == "linear":
            y = gdn_step(
                layer.linear_attn, a, [s.gdn[idx] for s in sessions], kernels, tables.get(idx)
            )
        else:
            caches = [s.attn[idx] for s in sessions]
            y = attention_step(
                layer.self_attn,
                a,
                caches,
                pos,
                cos,
                sin,
                model.rotary,
                kernels,
                tables.get(idx),
                once,
            )
        r, xn = mlp_half(model, idx, r, y, w)
    # the draw for pos + 1 (greedy: the first maximum), its flag, the next token, position
    (draw or kernels.greedy_step)(model.head_logits(r, xn), out, tok, pos)
    # the rows recorded for the MTP head, and the verdict posted, in one launch at the end
    kernels.record_row(record[0], record[1], r, out, ring)


@torch.no_grad()
def plain_step(model, sessions, tok, pos, out, record, tables=None, draw=None, ring=None):
    """`step` for a sibling (models/qwen3.py's plain pre-norm blocks): each op its shared
    rounds' on the same row (the blocks' read, mixer and mlp halves; attention through
    kernels.causal_sessions on each session's cache in place), the final norm's output
    recorded as the row's residual (what its MTP head reads)."""
    kernels, tables = model.kernels, tables or {}
    h = kernels.embed_rows(model.embed_tokens.weight, tok, 1)
    cos, sin, *_, lengths = kernels.step_angles(pos, model.rotary.inv(pos.device), h.dtype, 1)
    for idx, layer in enumerate(model.layers):
        a = layer.input_layernorm(h)
        if layer.kind == "linear":
            states = [s.gdn[idx] for s in sessions]
            y = gdn_step(layer.linear_attn, a, states, kernels, tables.get(idx))
        else:
            attn, caches = layer.self_attn, [s.attn[idx] for s in sessions]
            q, gate, k, v = attn.project(a, cos, sin)
            scale = attn.cfg.head_dim**-0.5
            o = kernels.causal_sessions(q, k, v, caches, pos, scale, tables.get(idx), lengths)
            y = attn.output(o, gate)
        h = layer.mlp_half(h + y, kernels)
    r = model.norm(h)
    (draw or kernels.greedy_step)(model.head_logits(r), out, tok, pos)
    kernels.record_row(record[0], record[1], r, out, ring)


def embedded(model: FlashNext, tok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The rows of tokens tok [N] on the hyper-connection streams [N, hc*H], and the first
    layer's read norm of them in the same launch (None before a PLE layer, which adds to the
    streams first)."""
    kernels, first, hc = model.kernels, model.layers[0], model.cfg.hc_count
    if first.ple is None:
        norm = first.attn_hyper_connection.hc_norm
        return kernels.embed_rows(model.embed_tokens.weight, tok, hc, (norm.weight, norm.eps))
    return kernels.embed_rows(model.embed_tokens.weight, tok, hc), None


def mlp_half(model: FlashNext, idx: int, r, y, w) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Layer idx's mlp_half, with the next read's norm from its last write where one follows
    (`_next_read`): (the residual, that norm or None)."""
    layer, then = model.layers[idx], _next_read(model, idx)
    if then is None:
        return layer.mlp_half(r, y, w, model.kernels), None
    return layer.mlp_half(r, y, w, model.kernels, then)


def _next_read(model: FlashNext, idx: int):
    """The hyper-connection that reads layer idx's output next (the next layer's, or the
    head's mixer), whose norm the layer's last write makes; None before a PLE layer, which
    adds to the streams first."""
    layers = model.layers
    if idx + 1 == len(layers):
        return model.hyper_connection_mixer
    return layers[idx + 1].attn_hyper_connection if layers[idx + 1].ple is None else None


def stacked(xs: list[torch.Tensor]) -> torch.Tensor:
    """[B, ...] of the sessions' tensors (one session: a view, no copy)."""
    return xs[0][None] if len(xs) == 1 else torch.stack(xs)


def ple_step(ple, r: torch.Tensor, states: list[PleState], tok: torch.Tensor, kernels, table=None):
    # one session: its ids move on and the conv moves its window in place (views); several:
    # stacked copies, copied back (through `table` where given: state.ple_table)
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
    added, xfull = ple.stacked(
        r[:, None], history, stacked([p.conv for p in states]), kernels, shift=one, added=True
    )
    if not one:
        copy_all(
            [p.ids for p in states] + [p.conv for p in states], [*history[:, 1:], *xfull[:, 1:]]
        )
    return added[:, 0]


def gdn_step(gdn, a: torch.Tensor, states: list[GdnState], kernels, table) -> torch.Tensor:
    qkv, gate_a, gate_b, z = gdn.project(a)
    gates = gdn.gates(gate_a[:, None], gate_b[:, None])  # computed in the rule's programs
    # the conv moves each window past the row, and the rule updates each recurrent state,
    # in place: one session's as views, several (or one with a table) through the table
    if len(states) == 1 and table is None:
        y, _ = kernels.causal_conv(qkv[:, None], states[0].conv[None], gdn.conv_weight, shift=True)
        q, k, v = gdn.heads(y, kernels)
        s = states[0].recurrent  # the kernel reads each tile before it writes it
        o, _ = kernels.recurrent_gdn(q, k, v, None, None, s[None], out=s[None, None], gates=gates)
    else:
        y, _ = kernels.conv_sessions(qkv[:, None], [g.conv for g in states], gdn.conv_weight, table)
        q, k, v = gdn.heads(y, kernels)
        o = kernels.gdn_sessions(
            q, k, v, None, None, [g.recurrent for g in states], table, gates=gates
        )
    return gdn.finish(o[:, 0], z)


def attention_step(
    attn,
    a,
    caches: list[AttnCache],
    pos,
    cos,
    sin,
    rotary,
    kernels,
    table,
    once: tuple | None = None,
):
    """once: `attention_once`'s tensors, made once for every attention layer of the step."""
    cfg, norm = attn.cfg, attn.indexer.k_layernorm
    q, gate, k, v, iq, raw = attn.project(a, cos, sin)
    bcos, bsin, lengths = once or attention_once(attn.cfg, rotary, pos, caches[0].block_keys.dtype)
    o = kernels.attend_sessions(
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
    return attn.output(o, gate)


def attention_once(cfg, rotary, pos: torch.Tensor, dtype: torch.dtype) -> tuple:
    """What every attention layer of a step reads alike: cos / sin of each row's block's
    first position (for pooling the block again) and the rows' cache lengths pos + 1."""
    return (*rotary.cos_sin(pos, dtype, cfg.indexer_block), pos + 1)


def session_tables(
    sessions: list[SessionState],
    anchor: SessionState | None = None,
    host: bool = False,
    mtp: bool = False,
) -> dict:
    """Each layer's table of these sessions' buffers (state.attn_table, state.gdn_table), by
    layer index: a graph of their step needs them made before its capture, and kept while it
    lives. Attention layers get one for a single session too (the Triton kernels then write
    its rows in their own launches, not three index_copy_ launches and their waits); GDN
    layers only for two sessions or more (one session's state is read as views).

    With `anchor`, every layer's table (PLE layers' too, by ("ple", idx): state.ple_table)
    for any number of sessions, offsets from the anchor's buffers: a step given the anchor
    as its first session reads and writes these sessions, so one graph of B rows serves any
    B sessions (runner/lone.py). host: the tables stay on the CPU. mtp: the MTP head's
    caches' too, by ("mtp", j) (drafted steps, runner/lone_draft.py)."""
    if not sessions:
        return {}
    if anchor is not None:
        tables: dict = {
            idx: attn_table([s.attn[idx] for s in sessions], a, host)
            for idx, a in anchor.attn.items()
        }
        tables.update(
            {
                idx: gdn_table([s.gdn[idx] for s in sessions], g, host)
                for idx, g in anchor.gdn.items()
            }
        )
        tables.update(
            {
                ("ple", idx): ple_table([s.ple[idx] for s in sessions], p, host)
                for idx, p in anchor.ple.items()
            }
        )
    else:
        tables = {idx: attn_table([s.attn[idx] for s in sessions]) for idx in sessions[0].attn}
        if len(sessions) > 1:
            tables.update(
                {idx: gdn_table([s.gdn[idx] for s in sessions]) for idx in sessions[0].gdn}
            )
    if mtp:
        bases = anchor.mtp if anchor is not None else [None] * len(sessions[0].mtp)
        tables.update(
            {
                ("mtp", j): attn_table([s.mtp[j] for s in sessions], a, host)
                for j, a in enumerate(bases)
            }
        )
    return tables
