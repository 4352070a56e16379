"""Session buffers gathered and put back through a session table (`reference.gather_sessions`,
`reference.put_sessions`): batch b's buffer lies at the table's offset from the first
buffer handed in, so a CUDA graph captured with one buffer serves any sessions the table
names (runner/lone.py's step graphs). Copies: the same bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.pdl import enter, pdl
from flashlane.kernels.session_tables import offsets_table
from flashlane.kernels.tables import TABLE_WIDTH

__all__ = ["gather_sessions", "put_sessions", "put_sessions_from"]

BLOCK = 1024


@triton.jit(do_not_specialize=["n", "nt"])
def _sessions_kernel(
    base_ptr,
    tab_ptr,
    dense_ptr,
    tail_ptr,
    n,
    nt,
    COLUMN: tl.constexpr,
    PUT: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    # dense's rows are n + nt apart: session b's n elements, then (a gather's) tail's row b
    # of nt, copied by the programs past the first cdiv(n, BLOCK)
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    b = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1).to(tl.int64)
    row = n + nt
    if block * BLOCK < n:
        cols = block * BLOCK + tl.arange(0, BLOCK)
        mask = cols < n
        at = tl.load(tab_ptr + b * TABLE_WIDTH + COLUMN)  # elements from the first buffer
        if PUT:
            values = tl.load(dense_ptr + b * row + cols, mask=mask)
            tl.store(base_ptr + at + cols, values, mask=mask)
        else:
            values = tl.load(base_ptr + at + cols, mask=mask)
            tl.store(dense_ptr + b * row + cols, values, mask=mask)
    else:
        cols = (block - tl.cdiv(n, BLOCK)) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < nt
        tail = tl.load(tail_ptr + b * nt + cols, mask=mask)
        tl.store(dense_ptr + b * row + n + cols, tail, mask=mask)


def _launch(
    first: torch.Tensor,
    table: torch.Tensor,
    dense: torch.Tensor,
    column: int,
    put: bool,
    tail: torch.Tensor | None = None,
) -> None:
    if not first.is_contiguous() or not dense.is_contiguous():
        raise ValueError("gather_sessions / put_sessions: contiguous buffers only")
    b, n = table.shape[0], first.numel()
    nt = 0 if tail is None else tail[0].numel()
    if b and n + nt:
        grid = (b, triton.cdiv(n, BLOCK) + triton.cdiv(nt, BLOCK))
        _sessions_kernel[grid](
            first,
            table,
            dense,
            dense if tail is None else tail,
            n,
            nt,
            COLUMN=column,
            PUT=put,
            BLOCK=BLOCK,
            **pdl(first.device),
        )


def gather_sessions(
    tensors: list[torch.Tensor],
    table: torch.Tensor | None = None,
    column: int = 0,
    tail: torch.Tensor | None = None,
) -> torch.Tensor:
    """reference.gather_sessions in one launch, through `table` (made here when not given:
    a CUDA graph needs it made before its capture); tail [B, m, ...] appended along dim 1
    in the same launch."""
    if table is None:
        table, column = offsets_table([tensors], align=[1]), 0
    first = tensors[0]
    shape = (table.shape[0], *first.shape)
    if tail is not None:
        if tail.shape[0] != shape[0] or tail.shape[2:] != first.shape[1:]:
            raise ValueError(f"gather_sessions: tail {tuple(tail.shape)} does not follow {shape}")
        tail = tail.to(first.dtype).contiguous()
        shape = (shape[0], shape[1] + tail.shape[1], *shape[2:])
    out = torch.empty(shape, dtype=first.dtype, device=first.device)
    _launch(first, table, out, column, False, tail)
    return out


def put_sessions(
    tensors: list[torch.Tensor],
    values: torch.Tensor,
    table: torch.Tensor | None = None,
    column: int = 0,
) -> None:
    """reference.put_sessions in one launch, through `table` (as gather_sessions')."""
    if table is None:
        table, column = offsets_table([tensors], align=[1]), 0
    _launch(tensors[0], table, values.to(tensors[0].dtype).contiguous(), column, True)


@triton.jit
def _put_from(base_ptr, tab_ptr, src_ptr, start_ptr, n, row, stride, b, chunk, COLUMN, BLOCK):
    """Chunk `chunk` of batch b's slice src[b, start[b]:] (n elements) to its buffer."""
    cols = chunk.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    at = tl.load(tab_ptr + b * TABLE_WIDTH + COLUMN)  # elements from the first buffer
    first = b * stride + tl.load(start_ptr + b) * row  # src[b, start[b]]
    value = tl.load(src_ptr + first + cols, mask=mask)
    tl.store(base_ptr + at + cols, value.to(base_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["n", "row", "stride"])
def _put_from_kernel(
    base_ptr,
    tab_ptr,
    src_ptr,
    start_ptr,
    n,
    row,
    stride,
    COLUMN: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    b = tl.program_id(0).to(tl.int64)
    _put_from(base_ptr, tab_ptr, src_ptr, start_ptr, n, row, stride, b, tl.program_id(1),
              COLUMN, BLOCK)  # fmt: skip


@triton.jit(do_not_specialize=["n0", "row0", "stride0", "n1", "row1", "stride1"])
def _put_from_two_kernel(
    base0,
    src0,
    start0,
    base1,
    src1,
    start1,
    tab_ptr,
    n0,
    row0,
    stride0,
    n1,
    row1,
    stride1,
    C0: tl.constexpr,
    C1: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    # program (b, chunk, which): put `which` of the two, through one table
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    b, chunk = tl.program_id(0).to(tl.int64), tl.program_id(1)
    if tl.program_id(2) == 0:
        _put_from(base0, tab_ptr, src0, start0, n0, row0, stride0, b, chunk, C0, BLOCK)
    else:
        _put_from(base1, tab_ptr, src1, start1, n1, row1, stride1, b, chunk, C1, BLOCK)


def put_sessions_from(
    tensors: list[torch.Tensor],
    src: torch.Tensor,
    start: torch.Tensor,
    rows: int,
    table: torch.Tensor | None = None,
    column: int = 0,
    also: tuple | None = None,
) -> None:
    """reference.put_sessions_from in one launch, through `table` (as gather_sessions'): the
    slice is read where it lies, cast to the buffers' dtype, and written in place. also: a
    second put (tensors, src, start, rows, column) through the same table, in that launch
    (a layer's two states: a drafted step's commit)."""
    puts = [(tensors, src, start, rows, column)] + ([also] if also is not None else [])
    if table is None:  # a table of each put's own buffers
        for ts, x, at, n, _ in puts:
            _put_from_args(ts, x, at, n, offsets_table([ts], align=[1]), 0, launch=True)
        return
    args = [_put_from_args(*put[:4], table, put[4]) for put in puts]
    b = table.shape[0]
    if len(args) == 1 or not b:
        for ts, x, at, n, c in puts:
            _put_from_args(ts, x, at, n, table, c, launch=True)
        return
    (p0, c0), (p1, c1) = args
    n = max(p0[4], p1[4])
    _put_from_two_kernel[(b, triton.cdiv(n, BLOCK), 2)](
        *p0[:3], *p1[:3], table, *p0[4:], *p1[4:],
        C0=c0, C1=c1, BLOCK=BLOCK, **pdl(p0[0].device),
    )  # fmt: skip


def _put_from_args(tensors, src, start, rows, table, column, launch=False):
    """put_sessions_from's checks -> ((first, src, start, table, n, row, stride), column);
    launch: its own launch too."""
    first, b = tensors[0], table.shape[0]
    row = src[0, 0].numel()  # elements of one src row
    if not first.is_contiguous() or not src.is_contiguous():
        raise ValueError("put_sessions_from: contiguous buffers only")
    if first.numel() != rows * row:
        raise ValueError(
            f"put_sessions_from: a buffer of {first.numel()} elements, {rows} rows of {row}"
        )
    args = (first, src, start, table, first.numel(), row, src[0].numel())
    if launch and b and first.numel():
        _put_from_kernel[(b, triton.cdiv(first.numel(), BLOCK))](
            first, table, src, start, *args[4:], COLUMN=column, BLOCK=BLOCK,
            **pdl(first.device),
        )  # fmt: skip
    return args, column
