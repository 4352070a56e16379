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


@triton.jit(do_not_specialize=["n"])
def _sessions_kernel(
    base_ptr,
    tab_ptr,
    dense_ptr,
    n,
    COLUMN: tl.constexpr,
    PUT: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    b = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    at = tl.load(tab_ptr + b * TABLE_WIDTH + COLUMN)  # elements from the first buffer
    if PUT:
        tl.store(base_ptr + at + cols, tl.load(dense_ptr + b * n + cols, mask=mask), mask=mask)
    else:
        tl.store(dense_ptr + b * n + cols, tl.load(base_ptr + at + cols, mask=mask), mask=mask)


def _launch(
    first: torch.Tensor, table: torch.Tensor, dense: torch.Tensor, column: int, put: bool
) -> None:
    if not first.is_contiguous() or not dense.is_contiguous():
        raise ValueError("gather_sessions / put_sessions: contiguous buffers only")
    b, n = table.shape[0], first.numel()
    if b and n:
        _sessions_kernel[(b, triton.cdiv(n, BLOCK))](
            first, table, dense, n, COLUMN=column, PUT=put, BLOCK=BLOCK, **pdl(first.device)
        )


def gather_sessions(
    tensors: list[torch.Tensor], table: torch.Tensor | None = None, column: int = 0
) -> torch.Tensor:
    """reference.gather_sessions in one launch, through `table` (made here when not given:
    a CUDA graph needs it made before its capture)."""
    if table is None:
        table, column = offsets_table([tensors], align=[1]), 0
    first = tensors[0]
    out = torch.empty((table.shape[0], *first.shape), dtype=first.dtype, device=first.device)
    _launch(first, table, out, column, False)
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
    cols = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    at = tl.load(tab_ptr + b * TABLE_WIDTH + COLUMN)  # elements from the first buffer
    first = b * stride + tl.load(start_ptr + b) * row  # src[b, start[b]]
    value = tl.load(src_ptr + first + cols, mask=mask)
    tl.store(base_ptr + at + cols, value.to(base_ptr.dtype.element_ty), mask=mask)


def put_sessions_from(
    tensors: list[torch.Tensor],
    src: torch.Tensor,
    start: torch.Tensor,
    rows: int,
    table: torch.Tensor | None = None,
    column: int = 0,
) -> None:
    """reference.put_sessions_from in one launch, through `table` (as gather_sessions'): the
    slice is read where it lies, cast to the buffers' dtype, and written in place."""
    if table is None:
        table, column = offsets_table([tensors], align=[1]), 0
    first, b = tensors[0], table.shape[0]
    row = src[0, 0].numel()  # elements of one src row
    if not first.is_contiguous() or not src.is_contiguous():
        raise ValueError("put_sessions_from: contiguous buffers only")
    if first.numel() != rows * row:
        raise ValueError(
            f"put_sessions_from: a buffer of {first.numel()} elements, {rows} rows of {row}"
        )
    if b and first.numel():
        _put_from_kernel[(b, triton.cdiv(first.numel(), BLOCK))](
            first,
            table,
            src,
            start,
            first.numel(),
            row,
            src[0].numel(),
            COLUMN=column,
            BLOCK=BLOCK,
            **pdl(first.device),
        )
