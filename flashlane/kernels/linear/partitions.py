"""The K partitions' sums, the heart of row invariance (`triton.py` says why): each
partition accumulates its K blocks in ascending order from zero in fp32, and the partitions
are added in ascending order. Device functions shared by `linear` and the hyper-connection's
up projection (`rowwise/triton_hc_up.py`), so both compute the same bits for the same spans."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = [
    "all_partitions",
    "k_block",
    "partition_sum",
    "product",
]


@triton.jit
def k_block(x_ptr, w_ptr, rm, rn, m_mask, n_mask, kb, K, stride_x, BLOCK_K: tl.constexpr):
    """K block kb of x's rows and w's columns: a [BLOCK_M, BLOCK_K], b [BLOCK_K, BLOCK_N]."""
    rk = kb * BLOCK_K + tl.arange(0, BLOCK_K)
    k_mask = rk < K
    a = tl.load(
        x_ptr + rm[:, None].to(tl.int64) * stride_x + rk[None, :],
        mask=m_mask[:, None] & k_mask[None, :],
        other=0.0,
    )
    b = tl.load(
        w_ptr + rn[None, :].to(tl.int64) * K + rk[:, None],
        mask=n_mask[None, :] & k_mask[:, None],
        other=0.0,
    )
    return a, b


@triton.jit
def product(a, b, acc, FP32_PRODUCTS: tl.constexpr):
    if FP32_PRODUCTS:
        # exact products of the inputs' values, whatever their dtype (no-op casts for fp32)
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def partition_sum(
    x_ptr,
    w_ptr,
    rm,
    rn,
    m_mask,
    n_mask,
    part,
    K,
    stride_x,
    BLOCKS_PER_PART: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FP32_PRODUCTS: tl.constexpr,
):
    """Sum over partition `part`'s K blocks, in ascending order, from zero, in fp32."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_blocks = tl.cdiv(K, BLOCK_K)
    start = part * BLOCKS_PER_PART
    end = tl.minimum(start + BLOCKS_PER_PART, k_blocks)
    for kb in range(start, end):
        a, b = k_block(x_ptr, w_ptr, rm, rn, m_mask, n_mask, kb, K, stride_x, BLOCK_K)
        acc = product(a, b, acc, FP32_PRODUCTS)
    return acc


@triton.jit
def all_partitions(
    x_ptr,
    w_ptr,
    rm,
    rn,
    m_mask,
    n_mask,
    K,
    stride_x,
    BLOCKS_PER_PART: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FP32_PRODUCTS: tl.constexpr,
    BRANCH: tl.constexpr = False,
):
    """((p0 + p1) + p2) + ... over every partition in one loop over all K blocks (one
    software pipeline, not one a partition: partitions of 2-4 blocks spent most of their
    time filling and draining it). At each partition's last block its sum joins the total
    and the accumulator restarts from zero: in a branch (BRANCH, the prefill tiles': the
    tensor cores' pipeline waits for the accumulator once a partition, 737 -> 492 us for
    2560x6144 at 8,192 rows, prefill_variants_fcde8a7_*.log), or by a select at every block,
    the total getting +0.0 elsewhere, which changes nothing (neither sum is ever -0.0: both
    start at +0.0, and x + y is -0.0 only when both are). Either way the bits are those of
    the loop over partitions."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_blocks = tl.cdiv(K, BLOCK_K)
    for kb in range(0, k_blocks):
        a, b = k_block(x_ptr, w_ptr, rm, rn, m_mask, n_mask, kb, K, stride_x, BLOCK_K)
        acc = product(a, b, acc, FP32_PRODUCTS)
        edge = ((kb + 1) % BLOCKS_PER_PART == 0) | (kb == k_blocks - 1)
        if BRANCH:
            if edge:
                total = total + acc
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        else:
            total = total + tl.where(edge, acc, 0.0)
            acc = tl.where(edge, 0.0, acc)
    return total
