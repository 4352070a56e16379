"""The indexer's block keys in one launch: pool (the block's raw keys added in order in fp32,
divided, rounded), the zero-centred RMSNorm and RoPE, as reference.block_keys with the
Triton norms' and rowwise rope's arithmetic. `pool_block_at` is the same math for the block
that holds a device-side position (the lone step), written in place: the two share one
function, so a lone step and a shared round give a block the same bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.norms.triton import rms_factor
from flashlane.kernels.pdl import enter, pdl
from flashlane.kernels.session_tables import TABLE_COLUMNS
from flashlane.kernels.tables import BLOCKS_COL, INDEX_COL, IS_COL, NB_COL, TABLE_WIDTH, no_table


@triton.jit
def _raw(raw_ptr, scale_ptr, j, DI, cols, mask, dt: tl.constexpr, FP8: tl.constexpr):
    """Row j's raw keys at cols in fp32: an 8-bit cache's e4m3 times the row's scale,
    rounded to the compute dtype dt first (the values kv8.dequantize gives)."""
    x = tl.load(raw_ptr + j * DI + cols, mask=mask, other=0.0).to(tl.float32)
    if FP8:
        x = (x * tl.load(scale_ptr + j)).to(dt).to(tl.float32)
    return x


@triton.jit
def _block_key(
    raw_ptr,
    cos_ptr,
    sin_ptr,
    w_ptr,
    out_ptr,
    eps,
    BLOCK: tl.constexpr,
    DI: tl.constexpr,
    R: tl.constexpr,
    BDI: tl.constexpr,
    scale_ptr,
    FP8: tl.constexpr,
):
    """raw_ptr: the block's BLOCK rows of DI (e4m3 with FP8, their scales at scale_ptr);
    cos_ptr, sin_ptr: its R values; out_ptr: DI."""
    cols = tl.arange(0, BDI)
    mask = cols < DI
    dt: tl.constexpr = out_ptr.dtype.element_ty
    total = _raw(raw_ptr, scale_ptr, 0, DI, cols, mask, dt, FP8)
    for j in tl.static_range(1, BLOCK):
        total = total + _raw(raw_ptr, scale_ptr, j, DI, cols, mask, dt, FP8)
    x = (total / BLOCK).to(dt).to(tl.float32)
    r = rms_factor(x, DI, eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = ((x * r) * (1.0 + w)).to(dt).to(tl.float32)
    # the same normed row, each rotated dim's partner (rotate-half)
    half: tl.constexpr = R // 2
    rot = cols < R
    partner = tl.where(cols < half, cols + half, cols - half)
    xp = _raw(raw_ptr, scale_ptr, 0, DI, partner, rot, dt, FP8)
    for j in tl.static_range(1, BLOCK):
        xp = xp + _raw(raw_ptr, scale_ptr, j, DI, partner, rot, dt, FP8)
    yp = (
        (
            (((xp / BLOCK).to(dt).to(tl.float32)) * r)
            * (1.0 + tl.load(w_ptr + partner, mask=rot, other=0.0).to(tl.float32))
        )
        .to(dt)
        .to(tl.float32)
    )
    yp = tl.where(cols < half, -yp, yp)
    c = tl.load(cos_ptr + cols, mask=rot, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + cols, mask=rot, other=0.0).to(tl.float32)
    both = (y * c).to(dt).to(tl.float32) + (yp * s).to(dt).to(tl.float32)
    tl.store(out_ptr + cols, tl.where(rot, both, y).to(dt), mask=mask)


@triton.jit(do_not_specialize=["stride_raw", "stride_out"])
def _block_keys_kernel(
    raw_ptr,
    cos_ptr,
    sin_ptr,
    w_ptr,
    out_ptr,
    stride_raw,
    stride_out,
    eps,
    BLOCK: tl.constexpr,
    DI: tl.constexpr,
    R: tl.constexpr,
    BDI: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    b = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1).to(tl.int64)
    _block_key(
        raw_ptr + b * stride_raw + n * BLOCK * DI,
        cos_ptr + n * R,
        sin_ptr + n * R,
        w_ptr,
        out_ptr + b * stride_out + n * DI,
        eps,
        BLOCK,
        DI,
        R,
        BDI,
        raw_ptr,  # no scales: a plain cache's raw keys
        False,
    )


@triton.jit(do_not_specialize=["nb", "has_table"])
def _pool_block_at_kernel(
    keys_ptr,
    cos_ptr,
    sin_ptr,
    w_ptr,
    out_ptr,
    pos_ptr,
    tab_ptr,
    scale_ptr,
    nb,
    has_table,
    eps,
    BLOCK: tl.constexpr,
    DI: tl.constexpr,
    R: tl.constexpr,
    BDI: tl.constexpr,
    FP8: tl.constexpr = False,
    PDL: tl.constexpr = 0,
):
    # with a table, program i pools session i's block (session_tables.attn_table) at its position,
    # with its cos / sin; a runtime flag, so one compiled kernel serves both uses
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    i = tl.program_id(0)
    keys_off, out_off, count = i.to(tl.int64) * 0, i.to(tl.int64) * 0, nb.to(tl.int64)
    scale_off = keys_off
    if has_table != 0:
        row = tab_ptr + i * TABLE_WIDTH
        keys_off = tl.load(row + INDEX_COL)
        out_off = tl.load(row + BLOCKS_COL)
        count = tl.load(row + NB_COL)
        if FP8:
            scale_off = tl.load(row + IS_COL)
    keys_ptr += keys_off
    out_ptr += out_off
    scale_ptr += scale_off
    cos_ptr += i * R
    sin_ptr += i * R
    b = tl.load(pos_ptr + i).to(tl.int64) // BLOCK
    if b < count:
        _block_key(
            keys_ptr + b * BLOCK * DI,
            cos_ptr,
            sin_ptr,
            w_ptr,
            out_ptr + b * DI,
            eps,
            BLOCK,
            DI,
            R,
            BDI,
            scale_ptr + b * BLOCK,
            FP8,
        )


def _meta(block: int, di: int, cos: torch.Tensor) -> dict:
    return dict(BLOCK=block, DI=di, R=cos.shape[-1], BDI=triton.next_power_of_2(di))


def block_keys(raw_keys, cos, sin, weight, eps: float, block: int) -> torch.Tensor:
    b, n, di = raw_keys.shape
    nb = n // block
    raw = raw_keys[:, : nb * block].contiguous()
    out = torch.empty((b, nb, di), dtype=raw_keys.dtype, device=raw_keys.device)
    if b and nb:
        _block_keys_kernel[(b, nb)](
            raw,
            cos.contiguous(),
            sin.contiguous(),
            weight.contiguous(),
            out,
            raw.stride(0),
            out.stride(0),
            eps,
            **_meta(block, di, cos),
            **pdl(out.device),
        )
    return out


def pool_block_at(
    index_keys,
    out,
    pos,
    cos,
    sin,
    weight,
    eps: float,
    block: int,
    table: torch.Tensor | None = None,
    index_scale: torch.Tensor | None = None,
) -> None:
    """reference.pool_block_at; with `table` (session_tables.attn_table of B sessions):
    index_keys and out are the first session's, pos [B], cos and sin [B, R], and program b
    pools session b's block in place. index_scale ([L] fp32, the first session's with a
    table): index_keys are e4m3, read as kv8.dequantize gives them in out's dtype."""
    if table is None and out.shape[0] == 0:
        return
    _pool_block_at_kernel[(1 if table is None else table.shape[0],)](
        index_keys,
        cos.contiguous(),
        sin.contiguous(),
        weight.contiguous(),
        out,
        pos,
        no_table(pos.device) if table is None else table,
        index_keys if index_scale is None else index_scale,  # unused without FP8
        out.shape[0],
        int(table is not None),
        eps,
        **_meta(block, index_keys.shape[-1], cos),
        FP8=index_scale is not None,
        **pdl(out.device),
    )


@triton.jit
def _put_row(
    src_ptr, dst_ptr, tab_ptr, pos_ptr, i, chunk, W, S, COL: tl.constexpr, BLOCK: tl.constexpr
):
    """Chunk `chunk` of row i of src (W values, rows S apart) to session i's buffer (table
    column COL) at row pos[i]."""
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    m = cols < W
    at = tl.load(pos_ptr + i) * W + tl.load(tab_ptr + i * TABLE_WIDTH + COL)
    tl.store(dst_ptr + at + cols, tl.load(src_ptr + i * S + cols, mask=m), mask=m)


@triton.jit
def _put_rows_kernel(
    src_ptr,
    dst_ptr,
    tab_ptr,
    pos_ptr,
    W,
    COL: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    i, chunk = tl.program_id(0), tl.program_id(1)
    _put_row(src_ptr, dst_ptr, tab_ptr, pos_ptr, i, chunk, W, W, COL, BLOCK)


@triton.jit
def _put_three_kernel(
    s0,
    d0,
    s1,
    d1,
    s2,
    d2,
    tab_ptr,
    pos_ptr,
    W0,
    W1,
    W2,
    S0,
    S1,
    S2,
    C0: tl.constexpr,
    C1: tl.constexpr,
    C2: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    i = tl.program_id(0)
    which = tl.program_id(1)
    if which == 0:
        _put_row(s0, d0, tab_ptr, pos_ptr, i, 0, W0, S0, C0, BLOCK)
    elif which == 1:
        _put_row(s1, d1, tab_ptr, pos_ptr, i, 0, W1, S1, C1, BLOCK)
    else:
        _put_row(s2, d2, tab_ptr, pos_ptr, i, 0, W2, S2, C2, BLOCK)


def put_rows_three(
    dsts: list, columns: list[str], table: torch.Tensor, pos: torch.Tensor, srcs: list
) -> None:
    """put_rows for three buffers (the attention's keys, values and raw indexer keys) in one
    launch where each row fits a block; else three launches. Copies: the same values. Each
    source's rows are read where they lie (a column slice of a fused projection: no copy)."""
    ws = [d[0].numel() for d in dsts]
    if len(dsts) != 3 or max(ws) > 1024:
        for dst, column, src in zip(dsts, columns, srcs, strict=True):
            put_rows(dst, column, table, pos, src)
        return
    srcs = [
        _rows(s.reshape(s.shape[0], w).to(d.dtype)) for s, w, d in zip(srcs, ws, dsts, strict=True)
    ]
    cols = [TABLE_COLUMNS.index(c) for c in columns]
    _put_three_kernel[(srcs[0].shape[0], 3)](
        srcs[0],
        dsts[0],
        srcs[1],
        dsts[1],
        srcs[2],
        dsts[2],
        table,
        pos,
        *ws,
        *(s.stride(0) for s in srcs),
        C0=cols[0],
        C1=cols[1],
        C2=cols[2],
        BLOCK=triton.next_power_of_2(max(ws)),
        **pdl(dsts[0].device),
    )


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x [N, W] as rows of contiguous values, evenly spaced: x itself where it is (a view's
    row stride is passed on), else a copy."""
    return x if x.stride(-1) == 1 or x.shape[-1] == 1 else x.contiguous()


def put_rows(
    dst: torch.Tensor, column: str, table: torch.Tensor, pos: torch.Tensor, src: torch.Tensor
) -> None:
    """Session i's buffer `column` (session_tables.attn_table; dst: the first session's) gets src[i]
    at row pos[i]: each session's index_copy_ of one row, in one launch."""
    w = dst[0].numel()
    src = src.reshape(src.shape[0], w).to(dst.dtype).contiguous()
    block = min(1024, triton.next_power_of_2(w))
    _put_rows_kernel[(src.shape[0], triton.cdiv(w, block))](
        src,
        dst,
        table,
        pos,
        w,
        COL=TABLE_COLUMNS.index(column),
        BLOCK=block,
        **pdl(dst.device),
    )
