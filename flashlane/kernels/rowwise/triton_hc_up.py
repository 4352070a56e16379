"""The hyper-connection's up projection with the mix in its tile (`reference.py`'s
hc_up_mix, same signature): linear(squashed, up) then `triton_hc.hc_mix`, bit for bit, in
one launch at decode row counts; the K partitions and the prefetch are the linear's
(`kernels/linear/`), the mix's roundings `triton_hc.py`'s.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.linear.partitions import partition_sum
from flashlane.kernels.linear.prefetch import prefetch_rows, prefetch_span
from flashlane.kernels.linear.tiles import DECODE_ROWS, row_tile
from flashlane.kernels.linear.triton import linear
from flashlane.kernels.pdl import enter, pdl
from flashlane.kernels.rowwise.triton import rounded
from flashlane.kernels.rowwise.triton_hc import hc_mix, stream_mixed, write_weights


@triton.jit
def _streams(acc, BLOCK_M: tl.constexpr, HB: tl.constexpr, HC_P2: tl.constexpr):
    """The up projection's tile [BLOCK_M, HB * HC_P2], column j = h * HC_P2 + c, as HC_P2
    tiles [BLOCK_M, HB], one a stream (a reshape and splits: the values moved, not touched)."""
    # one return after constexpr branches: Triton compiles the code after a branch's return
    if HC_P2 == 1:  # (the streams past HC are never read)
        u0 = tl.reshape(acc, (BLOCK_M, HB))
        u1, u2, u3 = u0, u0, u0
    elif HC_P2 == 2:
        u0, u1 = tl.split(tl.reshape(acc, (BLOCK_M, HB, 2)))
        u2, u3 = u0, u1
    else:
        even, odd = tl.split(tl.reshape(acc, (BLOCK_M, HB, 2, 2)))  # c = 2 * c1 + c0
        u0, u2 = tl.split(even)
        u1, u3 = tl.split(odd)
    return u0, u1, u2, u3


@triton.jit(do_not_specialize=["M", "prefetch", "stride_x", "stride_inj"])
def _hc_up_mix_kernel(
    x_ptr,
    w_ptr,
    xn_ptr,
    inj_ptr,
    a_ptr,
    wo_ptr,
    M,
    H,
    K,
    stride_x,
    stride_inj,
    prefetch,
    HC: tl.constexpr,
    HC_P2: tl.constexpr,
    INJECT: tl.constexpr,
    PARTS: tl.constexpr,
    BLOCKS_PER_PART: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FP32_PRODUCTS: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    # the tile's column j is stream c = j % HC_P2 of output h = pid_n * HB + j // HC_P2: its
    # weight row is c * H + h, so a program holds every stream of its HB outputs
    HB: tl.constexpr = BLOCK_N // HC_P2
    pid_m = tl.program_id(0)
    j = tl.arange(0, BLOCK_N)
    hj = tl.program_id(1) * HB + j // HC_P2
    cj = j % HC_P2
    n_mask = (hj < H) & (cj < HC)
    rn = tl.where(n_mask, cj * H + hj, 0)
    if PDL:  # noqa: SIM102 (the weights nothing writes, into L2 while the kernel before runs)
        if prefetch > 0:
            elem: tl.constexpr = w_ptr.dtype.element_ty.primitive_bitwidth // 8
            prefetch_rows(w_ptr, rn, HC * H, K, 0, prefetch, elem)
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = rm < M
    # the linear's in-program partitions: ((p0 + p1) + p2) + ..., the same bits as `linear`
    total = partition_sum(
        x_ptr,
        w_ptr,
        rm,
        rn,
        m_mask,
        n_mask,
        0,
        K,
        stride_x,
        BLOCKS_PER_PART,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
        FP32_PRODUCTS,
    )
    for p in range(1, PARTS):
        total += partition_sum(
            x_ptr,
            w_ptr,
            rm,
            rn,
            m_mask,
            n_mask,
            p,
            K,
            stride_x,
            BLOCKS_PER_PART,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
            FP32_PRODUCTS,
        )
    dt: tl.constexpr = a_ptr.dtype.element_ty
    u0, u1, u2, u3 = _streams(total, BLOCK_M, HB, HC_P2)
    h = tl.program_id(1) * HB + tl.arange(0, HB)
    mask = m_mask[:, None] & (h < H)[None, :]
    base = rm[:, None].to(tl.int64) * HC * H + h[None, :]
    # hc_mix's sum: the streams added in order, each sum rounded, then divided
    mixed = stream_mixed(u0, xn_ptr, base, mask, dt)
    if HC > 1:
        mixed = rounded(mixed + stream_mixed(u1, xn_ptr, base + H, mask, dt), dt)
    if HC > 2:
        mixed = rounded(mixed + stream_mixed(u2, xn_ptr, base + 2 * H, mask, dt), dt)
    if HC > 3:
        mixed = rounded(mixed + stream_mixed(u3, xn_ptr, base + 3 * H, mask, dt), dt)
    tl.store(a_ptr + rm[:, None].to(tl.int64) * H + h[None, :], (mixed / HC).to(dt), mask=mask)
    if INJECT:  # noqa: SIM102
        if tl.program_id(1) == 0:  # the write weights, as hc_mix
            ch = tl.arange(0, HC_P2)
            at = m_mask[:, None] & (ch < HC)[None, :]
            inj = tl.load(
                inj_ptr + rm[:, None].to(tl.int64) * stride_inj + ch[None, :], mask=at, other=0.0
            )
            tl.store(
                wo_ptr + rm[:, None].to(tl.int64) * HC + ch[None, :],
                write_weights(inj, HC, dt),
                mask=at,
            )


def hc_up_mix(
    squashed: torch.Tensor,
    up: torch.Tensor,
    xn: torch.Tensor,
    inject: torch.Tensor | None,
    hc: int,
    tile: dict | None = None,
):
    """hc_mix(linear(squashed, up), xn, inject, hc) in one launch, bit for bit: a tile holds
    every stream of its outputs (the up projection's columns c * H + h for each c), so the
    mix runs on the sums before they are stored; the mix logits never go to memory. The
    linear's tile and partitions of the up projection, in one program each. At decode rows
    (up to DECODE_ROWS; on the H200 6.0 us a read against 8.0 + 3.9 at one row) and up to
    4 streams, a power of two (3 did not give the two launches' bits on the H200: the
    issue-26 shape sweep); else the two launches, with the same bits: above DECODE_ROWS
    (at 8,192 rows 431 against 266 us, benchmarks/hc_read_chain.py), and fp32 on a GPU
    (its compiler may contract a product and a sum into one FMA in one kernel and not the
    other: 3 streams, 70 rows). tile: tile_config's keys, to time another tile
    (benchmarks/hc_read_chain.py)."""
    m, k = squashed.shape
    n = up.shape[0]
    fp32_gpu = squashed.dtype == torch.float32 and squashed.is_cuda
    # 3 streams (a tile of 4 with one masked) gave other bits than the two launches on the
    # H200 at every row count, so a batch on one path and a lone row on the other differed
    if hc not in (1, 2, 4) or squashed.stride(-1) != 1 or n % hc or fp32_gpu or m > DECODE_ROWS:
        return hc_mix(linear(squashed, up), xn, inject, hc)
    h = n // hc
    up, xn = up.contiguous(), xn.contiguous()
    a = torch.empty((m, h), dtype=xn.dtype, device=xn.device)
    w = None if inject is None else torch.empty((m, hc), dtype=xn.dtype, device=xn.device)
    if m == 0 or h == 0:
        return a, w
    cfg = tile or row_tile(m, n, k, squashed.dtype)
    hc_p2 = triton.next_power_of_2(hc)
    hb = cfg["BLOCK_N"] // hc_p2
    launch = pdl(xn.device)
    grid = (triton.cdiv(m, cfg["BLOCK_M"]), triton.cdiv(h, hb))
    ahead = prefetch_span(up, cfg, m, grid[1], 1) if launch else 0
    _hc_up_mix_kernel[grid](
        squashed,
        up,
        xn,
        a if inject is None else inject,
        a,
        a if w is None else w,
        m,
        h,
        k,
        squashed.stride(0),
        0 if inject is None else inject.stride(0),
        ahead,
        HC=hc,
        HC_P2=hc_p2,
        INJECT=inject is not None,
        PARTS=cfg["PARTS"],
        BLOCKS_PER_PART=cfg["BLOCKS_PER_PART"],
        BLOCK_M=cfg["BLOCK_M"],
        BLOCK_N=cfg["BLOCK_N"],
        BLOCK_K=cfg["BLOCK_K"],
        FP32_PRODUCTS=squashed.dtype == torch.float32,
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
        **launch,
    )
    return a, w
