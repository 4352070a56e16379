"""A drafted step's verdict in one launch (`reference.accept_window`): each window row's draw
(the first maximum of its logits), which rows a session keeps, its draws and flags for the
host, the next pending token and position, and the kept rows' marks the commit and the next
drafts read.

The draws are greedy_step's programs (kernels/rowwise/triton_greedy.py): each row's logits in
chunks, the row's last chunk to finish takes the first maximum of the chunks' and stores the
row's draw and flag; the session's last row to finish (a second counter, partials.py's)
reads its window's draws and flags back and decides. Where torch's max would give a NaN's id
(a row with a NaN) the draw may differ, as greedy_step's: its flag is 0 either way, so the
kept rows are the same and the lone driver stops the stream."""

from __future__ import annotations

import triton
import triton.language as tl

from flashlane.kernels.partials import counters, last_to_arrive
from flashlane.kernels.pdl import enter, pdl
from flashlane.kernels.rowwise import reference
from flashlane.kernels.rowwise.triton_greedy import (
    BLOCK,
    CHUNK,
    chunk_partials,
    row_first_max,
    store_chunk_max,
)

__all__ = ["accept_window"]


@triton.jit(do_not_specialize=["v", "stride_l"])
def _accept_kernel(
    l_ptr,
    best_ptr,
    at_ptr,
    nan_ptr,
    count_ptr,
    ids_ptr,
    drafts_ptr,
    firsts_ptr,
    out_ptr,
    tok_ptr,
    pos_ptr,
    marks_ptr,
    B,
    v,
    stride_l,
    stride_d,
    stride_tok,
    T: tl.constexpr,
    BT: tl.constexpr,
    PARTS: tl.constexpr,
    PARTS_P2: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    part = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    store_chunk_max(l_ptr, row, stride_l, v, part, best_ptr, at_ptr, nan_ptr, PARTS, CHUNK, BLOCK)
    if last_to_arrive(count_ptr + row, PARTS):
        first, finite = row_first_max(best_ptr, at_ptr, nan_ptr, row, PARTS, PARTS_P2)
        b = row // T
        o_b = out_ptr + b * (2 * T + 1)
        tl.store(ids_ptr + row, first)
        tl.store(o_b + row % T, first)
        tl.store(o_b + T + row % T, finite.to(tl.int64))
        # rows' counters first, then the sessions' (B*T + b)
        if last_to_arrive(count_ptr + B * T + b, T):
            j = tl.arange(0, BT)
            in_window = j < T
            ids = tl.load(o_b + j, mask=in_window, other=0, cache_modifier=".cg")
            flags = tl.load(o_b + T + j, mask=in_window, other=0, cache_modifier=".cg")
            draft = j < T - 1
            d = tl.load(drafts_ptr + b * stride_d + j, mask=draft, other=-1)
            lands = (d == ids) & (flags != 0) & draft
            # the first draft that does not land (T-1 when all do): the kept rows are one more
            kept = tl.min(tl.where(draft & (lands == 0), j, T - 1), axis=0) + 1
            tl.store(o_b + 2 * T, kept.to(tl.int64))
            tl.store(tok_ptr + b * stride_tok, tl.sum(tl.where(j == kept - 1, ids, 0), axis=0))
            tl.store(marks_ptr + b, kept.to(tl.int64))
            tl.store(marks_ptr + B + b, (kept - 1).to(tl.int64))
            tl.store(marks_ptr + 2 * B + b, tl.load(firsts_ptr + b) + kept - 1)
            tl.store(pos_ptr + b, tl.load(pos_ptr + b) + kept)


def accept_window(logits, drafts, firsts, out, tok, pos, marks, ids) -> None:
    """reference.accept_window in one launch (logits [B*T, V] with unit column stride, ids
    [B*T] contiguous; drafts' rows and tok may lie apart: views of a drafted step's window
    [B, T], DraftBuffers). The reference's ops where the counters are not made yet (a graph
    captured before any split product ran)."""
    (n, v), b = logits.shape, drafts.shape[0]
    if n == 0:
        return
    t = n // b
    if n != b * t or t != drafts.shape[1] + 1 or v == 0 or v >= 2**31:
        raise ValueError(f"accept_window: logits {tuple(logits.shape)}, drafts {drafts.shape}")
    if not (logits.stride(-1) == 1 and ids.is_contiguous() and drafts.stride(-1) == 1):
        raise ValueError("accept_window: logits' and drafts' rows, contiguous ids")
    count = counters(logits.device, n + b)
    if count is None:
        reference.accept_window(logits, drafts, firsts, out, tok, pos, marks, ids)
        return
    parts = triton.cdiv(v, CHUNK)
    best, at, nan = chunk_partials(n, parts, logits.device)
    _accept_kernel[(parts, n)](
        logits,
        best,
        at,
        nan,
        count,
        ids,
        drafts,
        firsts,
        out,
        tok,
        pos,
        marks,
        b,
        v,
        logits.stride(0),
        drafts.stride(0),
        tok.stride(0),
        T=t,
        BT=triton.next_power_of_2(t),
        PARTS=parts,
        PARTS_P2=triton.next_power_of_2(parts),
        CHUNK=CHUNK,
        BLOCK=BLOCK,
        num_warps=4,
        **pdl(logits.device),
    )
