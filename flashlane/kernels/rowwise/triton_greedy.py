"""A greedy step's tail in one launch (`reference.greedy_step`): the first maximum of each
row of logits, whether it is finite, the next token and position.

The reference takes a float copy of the logits, a max over each row, and five small ops to
store the id, its finite flag, the next token and the position: about 25 us a lone step on
the H200, after a 290 us head. Here each row's logits are cut in chunks of CHUNK values, one
program a chunk: it finds its chunk's largest value (NaN set aside) and the first index that
holds it; the row's last chunk to finish (`kernels/partials.py`'s counter) takes the largest
of the chunks' in chunk order, the lowest index on ties: the first maximum of the row, as
torch's max gives it. The flag is 0 where the row holds a NaN or its maximum is infinite
(torch's isfinite of its max). A row whose flag is 0 may get another id than torch's (any
of its NaNs); the lone driver stops such a stream.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.partials import counters, last_to_arrive
from flashlane.kernels.pdl import enter, pdl
from flashlane.kernels.rowwise import reference

# values a program reads, in loads of BLOCK
CHUNK = 4096
BLOCK = 1024


@triton.jit
def chunk_first_max(l_ptr, row, stride_l, v, part, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """Chunk `part` of logits row `row` [v]: (its largest value with NaN set aside, the
    first index that holds it, its NaNs)."""
    start = part * CHUNK
    best = -float("inf")
    at = start
    nans = 0
    for b in tl.static_range(0, CHUNK, BLOCK):
        offs = start + b + tl.arange(0, BLOCK)
        ok = offs < v
        x = tl.load(l_ptr + row * stride_l + offs, mask=ok, other=-float("inf")).to(tl.float32)
        nan = x != x
        nans += tl.sum((nan & ok).to(tl.int32), axis=0)
        x = tl.where(nan, -float("inf"), x)
        m = tl.max(x, axis=0)
        i = tl.min(tl.where(x == m, offs, 2147483647), axis=0)
        at = tl.where(m > best, i, at)  # strictly larger: an earlier tie keeps its index
        best = tl.maximum(best, m)
    return best, at, nans


@triton.jit
def store_chunk_max(
    l_ptr, row, stride_l, v, part, best_ptr, at_ptr, nan_ptr, PARTS: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """chunk_first_max of chunk `part` of row `row`, stored in the row's partials (the slot
    row * PARTS + part) for row_first_max."""
    best, at, nans = chunk_first_max(l_ptr, row, stride_l, v, part, CHUNK, BLOCK)
    slot = row * PARTS + part
    tl.store(best_ptr + slot, best)
    tl.store(at_ptr + slot, at)
    tl.store(nan_ptr + slot, nans)


@triton.jit
def row_first_max(best_ptr, at_ptr, nan_ptr, row, PARTS: tl.constexpr, PARTS_P2: tl.constexpr):
    """In the row's last program to arrive: (the row's first maximum from its chunks', in
    chunk order, the lowest index on ties; whether it is finite with no NaN in the row). The
    chunks' are read through L2 (partials.last_to_arrive)."""
    p = tl.arange(0, PARTS_P2)
    in_row = p < PARTS
    bests = tl.load(
        best_ptr + row * PARTS + p, mask=in_row, other=-float("inf"), cache_modifier=".cg"
    )
    ats = tl.load(at_ptr + row * PARTS + p, mask=in_row, other=2147483647, cache_modifier=".cg")
    row_nans = tl.sum(
        tl.load(nan_ptr + row * PARTS + p, mask=in_row, other=0, cache_modifier=".cg"), axis=0
    )
    top = tl.max(bests, axis=0)
    first = tl.min(tl.where(bests == top, ats, 2147483647), axis=0).to(tl.int64)
    finite = (row_nans == 0) & (top != float("inf")) & (top != -float("inf"))
    return first, finite


@triton.jit(do_not_specialize=["v", "stride_l"])
def _greedy_kernel(
    l_ptr,
    best_ptr,
    at_ptr,
    nan_ptr,
    count_ptr,
    out_ptr,
    tok_ptr,
    pos_ptr,
    v,
    stride_l,
    stride_out,
    PARTS: tl.constexpr,
    PARTS_P2: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
    PICK: tl.constexpr = 0,
    PDL: tl.constexpr = 0,
):
    # PICK: the first maximum alone, into out (a column of drafts, rows stride_out apart)
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    part = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    store_chunk_max(l_ptr, row, stride_l, v, part, best_ptr, at_ptr, nan_ptr, PARTS, CHUNK, BLOCK)
    if last_to_arrive(count_ptr + row, PARTS):
        first, finite = row_first_max(best_ptr, at_ptr, nan_ptr, row, PARTS, PARTS_P2)
        tl.store(out_ptr + row * stride_out, first)
        if not PICK:
            tl.store(out_ptr + row * stride_out + 1, finite.to(tl.int64))
            tl.store(tok_ptr + row, first)
            tl.store(pos_ptr + row, tl.load(pos_ptr + row) + 1)


def chunk_partials(rows: int, parts: int, device) -> tuple[torch.Tensor, ...]:
    """The chunks' (best [rows, parts] fp32, at and nans int32) for chunk_first_max."""
    return (
        torch.empty((rows, parts), dtype=torch.float32, device=device),
        torch.empty((rows, parts), dtype=torch.int32, device=device),
        torch.empty((rows, parts), dtype=torch.int32, device=device),
    )


def greedy_step(
    logits: torch.Tensor, out: torch.Tensor, tok: torch.Tensor, pos: torch.Tensor
) -> None:
    """reference.greedy_step in one launch: logits [B, V] (any float dtype, read as fp32);
    out [B, 2+] int64 gets (first argmax, 1 if finite); tok [B] the ids; pos [B] + 1. The
    reference's ops where the counters are not made yet (a graph captured before any split
    product ran) or the buffers are not int64 on the logits' device."""
    b, v = logits.shape
    count = counters(logits.device, b)
    longs = all(t.dtype == torch.long and t.device == logits.device for t in (out, tok, pos))
    if (
        count is None
        or not longs
        or logits.stride(-1) != 1
        or not tok.is_contiguous()
        or not pos.is_contiguous()
        or b == 0
        or v == 0
        or v >= 2**31
    ):
        reference.greedy_step(logits, out, tok, pos)
        return
    _launch(logits, count, out, tok, pos, out.stride(0))


def _launch(logits, count, out, tok, pos, stride_out: int, pick: int = 0) -> None:
    (b, v), dev = logits.shape, logits.device
    parts = triton.cdiv(v, CHUNK)
    best, at, nan = chunk_partials(b, parts, dev)
    _greedy_kernel[(parts, b)](
        logits,
        best,
        at,
        nan,
        count,
        out,
        tok,
        pos,
        v,
        logits.stride(0),
        stride_out,
        PARTS=parts,
        PARTS_P2=triton.next_power_of_2(parts),
        CHUNK=CHUNK,
        BLOCK=BLOCK,
        PICK=pick,
        num_warps=4,
        **pdl(dev),
    )


def draft_pick(logits: torch.Tensor, drafts: torch.Tensor, d: int) -> None:
    """reference.draft_pick in one launch (greedy_step's programs, storing the first
    maximum alone): drafts[:, d] (drafts [B, K] int64) gets each row's first maximum of
    logits [B, V], NaN set aside (torch's argmax may pick a NaN's id: a draft no target
    draw equals). The reference's ops where greedy_step would fall back to them."""
    b, v = logits.shape
    count = counters(logits.device, b)
    col = drafts[:, d]
    if (
        count is None
        or drafts.dtype != torch.long
        or drafts.device != logits.device
        or logits.stride(-1) != 1
        or b == 0
        or v == 0
        or v >= 2**31
    ):
        reference.draft_pick(logits, drafts, d)
        return
    _launch(logits, count, col, col, col, col.stride(0), pick=1)
