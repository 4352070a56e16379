"""Row-invariant Triton GEMM: `linear(x, w) = x @ w.T` with one fixed tile per (N, K, dtype).

Row invariance (a row's output is bitwise the same whatever M, its offset and the other rows):

* the tile (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) depends only on (N, K, dtype), never
  on M, so every row goes through the same instructions;
* K is cut into PARTS fixed partitions of whole BLOCK_K blocks (PARTS depends only on N, K
  and dtype); each partition accumulates its blocks in ascending order from zero in fp32,
  and the partitions are added in ascending order: `((p0 + p1) + p2) + ...`.

Where those partition sums happen is the one thing chosen by M, and it does not change a
bit: with few row tiles (decode) each partition is its own program writing an fp32 partial
and a second kernel adds them in order (more programs for a memory-bound call); with many
row tiles (prefill) one program runs all partitions and adds them in the same order in
registers (no fp32 workspace). Both do the same fp32 operations on the same values; the
tests check the two bitwise against each other.

fp32 inputs take exact fp32 products (`input_precision="ieee"`): the MoE router is fp32.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

# programs to aim for in the split (few row tiles) variant: about one wave of 132 SMs
_TARGET_PROGRAMS = 160
# fewest K blocks in one partition (>= 2 also keeps every partition a real loop)
_MIN_BLOCKS_PER_PART = 4
# row tiles x column tiles from which one program runs all partitions
_IN_PROGRAM_TILES = 128


@functools.cache
def tile_config(n: int, k: int, dtype: torch.dtype) -> dict:
    """The one tile for (N, K, dtype); M never enters."""
    if dtype == torch.float32:
        bm, bn, bk, warps, stages = 64, 64, 32, 4, 2
    else:
        bm, bn, bk, warps, stages = 64, 64, 64, 4, 3
    n_tiles = triton.cdiv(n, bn)
    k_blocks = triton.cdiv(k, bk)
    parts = 1
    while (
        n_tiles * parts * 2 <= _TARGET_PROGRAMS and k_blocks // (parts * 2) >= _MIN_BLOCKS_PER_PART
    ):
        parts *= 2
    per_part = triton.cdiv(k_blocks, parts)
    parts = triton.cdiv(k_blocks, per_part)  # no empty partition
    return dict(
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        PARTS=parts,
        BLOCKS_PER_PART=per_part,
        num_warps=warps,
        num_stages=stages,
    )


@triton.jit
def _partition(
    x_ptr,
    w_ptr,
    rm,
    rn,
    m_mask,
    n_mask,
    part,
    K,
    BLOCKS_PER_PART: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Sum over partition `part`'s K blocks, in ascending order, from zero, in fp32."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_blocks = tl.cdiv(K, BLOCK_K)
    start = part * BLOCKS_PER_PART
    end = tl.minimum(start + BLOCKS_PER_PART, k_blocks)
    for kb in range(start, end):
        rk = kb * BLOCK_K + tl.arange(0, BLOCK_K)
        k_mask = rk < K
        a = tl.load(
            x_ptr + rm[:, None].to(tl.int64) * K + rk[None, :],
            mask=m_mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        b = tl.load(
            w_ptr + rn[None, :].to(tl.int64) * K + rk[:, None],
            mask=n_mask[None, :] & k_mask[:, None],
            other=0.0,
        )
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    return acc


@triton.jit(do_not_specialize=["M"])
def _linear_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    ws_ptr,
    M,
    N,
    K,
    PARTS: tl.constexpr,
    BLOCKS_PER_PART: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = rm < M
    n_mask = rn < N
    out_mask = m_mask[:, None] & n_mask[None, :]
    offs = rm[:, None].to(tl.int64) * N + rn[None, :]
    if SPLIT:
        part = tl.program_id(2)
        acc = _partition(
            x_ptr,
            w_ptr,
            rm,
            rn,
            m_mask,
            n_mask,
            part,
            K,
            BLOCKS_PER_PART,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
            PRECISION,
        )
        tl.store(ws_ptr + part.to(tl.int64) * M * N + offs, acc, mask=out_mask)
    else:
        total = _partition(
            x_ptr,
            w_ptr,
            rm,
            rn,
            m_mask,
            n_mask,
            0,
            K,
            BLOCKS_PER_PART,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
            PRECISION,
        )
        for p in tl.static_range(1, PARTS):
            acc = _partition(
                x_ptr,
                w_ptr,
                rm,
                rn,
                m_mask,
                n_mask,
                p,
                K,
                BLOCKS_PER_PART,
                BLOCK_M,
                BLOCK_N,
                BLOCK_K,
                PRECISION,
            )
            total = total + acc
        tl.store(y_ptr + offs, total.to(y_ptr.dtype.element_ty), mask=out_mask)


@triton.jit(do_not_specialize=["numel"])
def _sum_parts_kernel(ws_ptr, y_ptr, numel, PARTS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    total = tl.load(ws_ptr + offs, mask=mask, other=0.0)
    for p in tl.static_range(1, PARTS):
        total = total + tl.load(ws_ptr + p * numel + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, total.to(y_ptr.dtype.element_ty), mask=mask)


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w.T. x: [..., K] (bf16 / fp16 / fp32); w: [N, K] of x's dtype -> [..., N], x's dtype.

    fp32 accumulation; the result of a row never depends on the call's other rows.
    """
    k = x.shape[-1]
    n, kw = w.shape
    if kw != k:
        raise ValueError(f"linear: x has K={k}, w is {tuple(w.shape)}")
    if w.dtype != x.dtype:
        raise ValueError(f"linear: x is {x.dtype}, w is {w.dtype}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k).contiguous()
    w = w.contiguous()
    m = x2.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y.reshape(*lead, n)
    if k == 0:
        return y.zero_().reshape(*lead, n)
    cfg = tile_config(n, k, x.dtype)
    bm, bn, parts = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["PARTS"]
    m_tiles, n_tiles = triton.cdiv(m, bm), triton.cdiv(n, bn)
    split = parts > 1 and m_tiles * n_tiles < _IN_PROGRAM_TILES
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    meta = dict(
        PARTS=parts,
        BLOCKS_PER_PART=cfg["BLOCKS_PER_PART"],
        SPLIT=split,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=cfg["BLOCK_K"],
        PRECISION=precision,
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )
    if split:
        ws = torch.empty((parts, m, n), dtype=torch.float32, device=x.device)
        _linear_kernel[(m_tiles, n_tiles, parts)](x2, w, y, ws, m, n, k, **meta)
        block = 1024
        _sum_parts_kernel[(triton.cdiv(m * n, block),)](
            ws, y, m * n, PARTS=parts, BLOCK=block, num_warps=4
        )
    else:
        _linear_kernel[(m_tiles, n_tiles, 1)](x2, w, y, y, m, n, k, **meta)
    return y.reshape(*lead, n)
