"""A drafted step's verdict in one launch (`reference.accept_window`): which window rows a
session keeps, its draws and flags for the host, the next pending token and position, and
the kept rows' marks the commit and the next drafts read. One program a session; a window
is a few rows (T = K+1 <= 16)."""

from __future__ import annotations

import triton
import triton.language as tl

from flashlane.kernels.pdl import enter, pdl

__all__ = ["accept_window"]


@triton.jit
def _accept_kernel(
    ids_ptr,
    top_ptr,
    drafts_ptr,
    firsts_ptr,
    out_ptr,
    tok_ptr,
    pos_ptr,
    marks_ptr,
    B,
    stride_d,
    stride_tok,
    T: tl.constexpr,
    BT: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    b = tl.program_id(0)
    j = tl.arange(0, BT)
    row = j < T
    ids = tl.load(ids_ptr + b * T + j, mask=row, other=0)
    top = tl.load(top_ptr + b * T + j, mask=row, other=0.0).to(tl.float32)
    finite = tl.abs(top) < float("inf")  # false for NaN too
    draft = j < T - 1
    d = tl.load(drafts_ptr + b * stride_d + j, mask=draft, other=-1)
    lands = (d == ids) & finite & draft
    # the first draft that does not land (T-1 when all do): the kept rows are one more
    kept = tl.min(tl.where(draft & (lands == 0), j, T - 1), axis=0) + 1
    tl.store(out_ptr + b * (2 * T + 1) + j, ids, mask=row)
    tl.store(out_ptr + b * (2 * T + 1) + T + j, finite.to(tl.int64), mask=row)
    tl.store(out_ptr + b * (2 * T + 1) + 2 * T, kept.to(tl.int64))
    tl.store(tok_ptr + b * stride_tok, tl.sum(tl.where(j == kept - 1, ids, 0), axis=0))
    tl.store(marks_ptr + b, kept.to(tl.int64))
    tl.store(marks_ptr + B + b, (kept - 1).to(tl.int64))
    tl.store(marks_ptr + 2 * B + b, tl.load(firsts_ptr + b) + kept - 1)
    tl.store(pos_ptr + b, tl.load(pos_ptr + b) + kept)


def accept_window(ids, top, drafts, firsts, out, tok, pos, marks) -> None:
    """reference.accept_window in one launch (contiguous [B, T] ids and top; drafts' rows
    and tok may lie apart: views of a drafted step's window [B, T], DraftBuffers)."""
    b, t = ids.shape
    if b == 0:
        return
    if not (ids.is_contiguous() and top.is_contiguous() and drafts.stride(-1) == 1):
        raise ValueError("accept_window: contiguous ids and top, drafts' rows only")
    _accept_kernel[(b,)](
        ids,
        top,
        drafts,
        firsts,
        out,
        tok,
        pos,
        marks,
        b,
        drafts.stride(0),
        tok.stride(0),
        T=t,
        BT=triton.next_power_of_2(t),
        **pdl(ids.device),
    )
