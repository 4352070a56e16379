"""A lone step (runner/lone.py's LoneDriver replays it): one row per session through every
layer, each session's state read and written in place, then the next token's draw.

The layers are runner/trunk.py's (`trunk.layers` with runner/lone_state.py's `InPlace`), as
a drafted step's and the shared rounds' blocks'. A step launched before the reply's end was
read feeds a token the reply does not have; the stream has ended and its session is released,
so nothing reads that state. Attention reads the whole caches with the length on the device,
select_mask ranks without its host-side shortcut (the same mask), and a block's pooled key is
recomputed whenever a key is written into it (the indexer reads it only once the block is
complete). Each op is the one the shared rounds run, on the same row, so the bits are the
same, and so are sampled tokens (tests/runner/test_lone.py, test_lone_sampled.py and
test_lone_top_p.py on the CPU, tests/gpu/test_lone_gpu.py and test_lone_sampled_gpu.py with
graphs).
"""

from __future__ import annotations

import torch

from flashlane.models.flashnext import FlashNext
from flashlane.models.state import SessionState, attn_table, gdn_table, ple_table
from flashlane.runner import trunk
from flashlane.runner.lone_state import InPlace
from flashlane.sampling.lone_draw import KeyedDraw

__all__ = ["plain_step", "session_tables", "step"]


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
    with post_ring's slot: the caller's for step k - 1 of a call that set k to 0). The layers
    are runner/trunk.py's, every op the shared rounds' on the same rows (batched ops are
    row-invariant; attention, pooling and state commits read and write each session's own
    buffers: kernels.attend_sessions, with `tables` from session_tables, made where not
    given), so the bits are theirs. A sibling (Qwen3-Next, Qwen3.5: no hyper-connections)
    steps through `plain_step`."""
    if not isinstance(model, FlashNext):
        return plain_step(model, sessions, tok, pos, out, record, tables, draw, ring)
    cfg, kernels = model.cfg, model.kernels
    r, xn = trunk.embedded(model, tok)
    # the rows' cos / sin, and attention_once's tensors, in one launch
    cos, sin, *once = kernels.step_angles(
        pos, model.rotary.inv(pos.device), r.dtype, cfg.indexer_block
    )
    # xn: the next read's norm, where the launch before it made it
    state = InPlace(sessions, tables or {}, tok, pos, (cos, sin, once))
    r, xn = trunk.layers(model, r, xn, state)
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
    cos, sin, *once = kernels.step_angles(pos, model.rotary.inv(pos.device), h.dtype, 1)
    state, lengths = InPlace(sessions, tables, tok, pos, (cos, sin, once)), once[-1]
    for idx, layer in enumerate(model.layers):
        a = layer.input_layernorm(h)
        if layer.kind == "linear":
            gdn = layer.linear_attn
            qkv, gate_a, gate_b, z = gdn.project(a)
            y = gdn.finish(state.gdn(idx, gdn, qkv, gate_a, gate_b, kernels), z)
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
