"""Row-invariant Triton GEMM: `linear(x, w) = x @ w.T`, a row's bits the same whatever M.

Row invariance (a row's output is bitwise the same whatever M, its offset and the other rows):

* K is cut into PARTS fixed partitions (spans of K); PARTS and the spans depend only on
  (N, K, dtype); each partition accumulates its K in ascending order from zero in fp32, and
  the partitions are added in ascending order: `((p0 + p1) + p2) + ...`;
* the tile's shape (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) follows the call's row count
  (`tiles.py`: `tile_config` up to DECODE_ROWS rows, `prefill_tile` above), never the
  partitions. A product's bits depend on the partitions and on the tensor cores' k-steps of
  16, which run in the same order in every tile: on the H200 every tile of
  `benchmarks/tune_linears.py` (BLOCK_M 16 on mma.sync, 64 and 128 on wgmma, BLOCK_N
  64/128, BLOCK_K 64/128, 4/8 warps) gave the same bits for the same spans, normal and
  exponent-spread inputs, and
  tests/kernels/test_triton_dense.py checks a row alone against the same row in 200.

Where the partition sums happen is chosen by M too, and does not change a bit: with few row
tiles (decode) each partition is its own program writing an fp32 partial, and the last
program of each tile to finish adds them in order in the same launch (`kernels/partials.py`;
`_sum_parts_kernel`, a second launch, while a CUDA graph is captured before the counters
exist); with many row tiles (prefill) one program runs all partitions and adds them in the
same order in registers (no fp32 workspace). All do the same fp32 operations on the same
values; the tests check them bitwise against each other.

fp32 inputs take exact fp32 products (`input_precision="ieee"`: one FMA chain per output in
k's order, whatever the tile's rows) with the fp32 tiles. bf16 / fp16 inputs with
`out_dtype=torch.float32` (the MoE router) run on the tensor cores in their dtype's tiles and
store the fp32 sums unrounded (`_TENSOR_CORE_FP32_OUT`; False casts them in registers to the
fp32 path, bitwise `linear(x.float(), w.float())`).

Prefill tiles with six partitions or more run them all in one pipelined loop over K (FLAT,
`_all_partitions`): the same sums in the same order as the loop over partitions.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from flashlane.kernels.linear.tiles import DECODE_ROWS, prefill_tile, tile_config
from flashlane.kernels.partials import add_partials, counters, last_to_arrive

__all__ = ["DECODE_ROWS", "linear", "prefill_tile", "tile_config"]

# row tiles x column tiles from which one program runs all partitions
_IN_PROGRAM_TILES = 128
# split partitions added by each tile's last program (`kernels/partials.py`), not a 2nd kernel
_FIXUP = True
# programmatic dependent launch (Hopper), an experiment that is off: each launch may begin
# while the kernel before it drains, and waits for it (gdc_wait) before touching memory;
# `python benchmarks/bench_linears.py --device cuda --pdl` times it. Not run on a GPU yet.
_PDL = False
# bf16 / fp16 inputs with fp32 out (the router) on the tensor cores: exact bf16 products
# summed in fp32 by the bf16 tiles, row-invariant like every bf16 product, within 3.4e-7 of
# the largest logit of the FMA chains' exact fp32 sums, and 7.5x faster at 2,048 rows on the
# H200 (437 -> 59 us). False: FMA chains on the CUDA cores, bitwise linear(x.float(), ...)
_TENSOR_CORE_FP32_OUT = True


@triton.jit
def _k_block(x_ptr, w_ptr, rm, rn, m_mask, n_mask, kb, K, stride_x, BLOCK_K: tl.constexpr,
             SQUASH: tl.constexpr):
    """K block kb of x's rows and w's columns: a [BLOCK_M, BLOCK_K], b [BLOCK_K, BLOCK_N].
    With SQUASH = hc, each x value first becomes silu(x / hc) as rowwise hc_squash rounds it."""
    rk = kb * BLOCK_K + tl.arange(0, BLOCK_K)
    k_mask = rk < K
    a = tl.load(
        x_ptr + rm[:, None].to(tl.int64) * stride_x + rk[None, :],
        mask=m_mask[:, None] & k_mask[None, :],
        other=0.0,
    )
    if SQUASH > 0:
        dt: tl.constexpr = a.dtype
        h = (a.to(tl.float32) / SQUASH).to(dt).to(tl.float32)
        a = (h / (1.0 + tl.exp(-h))).to(dt)
    b = tl.load(
        w_ptr + rn[None, :].to(tl.int64) * K + rk[:, None],
        mask=n_mask[None, :] & k_mask[:, None],
        other=0.0,
    )
    return a, b


@triton.jit
def _product(a, b, acc, FP32_PRODUCTS: tl.constexpr):
    if FP32_PRODUCTS:
        # exact products of the inputs' values, whatever their dtype (no-op casts for fp32)
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc)


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
    stride_x,
    BLOCKS_PER_PART: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FP32_PRODUCTS: tl.constexpr,
    SQUASH: tl.constexpr,
):
    """Sum over partition `part`'s K blocks, in ascending order, from zero, in fp32."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_blocks = tl.cdiv(K, BLOCK_K)
    start = part * BLOCKS_PER_PART
    end = tl.minimum(start + BLOCKS_PER_PART, k_blocks)
    for kb in range(start, end):
        a, b = _k_block(x_ptr, w_ptr, rm, rn, m_mask, n_mask, kb, K, stride_x, BLOCK_K, SQUASH)
        acc = _product(a, b, acc, FP32_PRODUCTS)
    return acc


@triton.jit
def _all_partitions(
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
    SQUASH: tl.constexpr,
):
    """((p0 + p1) + p2) + ... over every partition in one loop over all K blocks (one
    software pipeline, not one a partition: partitions of 2-4 blocks spent most of their
    time filling and draining it). At each partition's last block its sum joins the total
    and the accumulator restarts from zero; elsewhere the total gets +0.0, which changes
    nothing (neither sum is ever -0.0: both start at +0.0, and x + y is -0.0 only when both
    are), so the bits are those of the loop over partitions."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_blocks = tl.cdiv(K, BLOCK_K)
    for kb in range(0, k_blocks):
        a, b = _k_block(x_ptr, w_ptr, rm, rn, m_mask, n_mask, kb, K, stride_x, BLOCK_K, SQUASH)
        acc = _product(a, b, acc, FP32_PRODUCTS)
        edge = ((kb + 1) % BLOCKS_PER_PART == 0) | (kb == k_blocks - 1)
        total = total + tl.where(edge, acc, 0.0)
        acc = tl.where(edge, 0.0, acc)
    return total


@triton.jit(do_not_specialize=["M"])
def _linear_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    ws_ptr,
    count_ptr,
    M,
    N,
    K,
    stride_x,
    PARTS: tl.constexpr,
    BLOCKS_PER_PART: tl.constexpr,
    SPLIT: tl.constexpr,
    FIXUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FP32_PRODUCTS: tl.constexpr,
    SQUASH: tl.constexpr,
    PDL: tl.constexpr = False,
    FLAT: tl.constexpr = False,
):
    if PDL:  # every load and store after the kernel before has finished and flushed
        gdc_wait()
        gdc_launch_dependents()
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
        acc = _partition(x_ptr, w_ptr, rm, rn, m_mask, n_mask, part, K, stride_x, BLOCKS_PER_PART,
            BLOCK_M, BLOCK_N, BLOCK_K, FP32_PRODUCTS, SQUASH)
        plane = M.to(tl.int64) * N
        tl.store(ws_ptr + part * plane + offs, acc, mask=out_mask)
        # a constexpr and a runtime test in one `and` would not fold the constexpr away
        if FIXUP:  # noqa: SIM102
            if last_to_arrive(count_ptr + pid_m * tl.num_programs(1) + pid_n, PARTS):
                total = add_partials(ws_ptr, offs, out_mask, plane, PARTS, ".cg")
                tl.store(y_ptr + offs, total.to(y_ptr.dtype.element_ty), mask=out_mask)
    elif FLAT:
        total = _all_partitions(x_ptr, w_ptr, rm, rn, m_mask, n_mask, K, stride_x,
                                BLOCKS_PER_PART, BLOCK_M, BLOCK_N, BLOCK_K, FP32_PRODUCTS,
                                SQUASH)
        tl.store(y_ptr + offs, total.to(y_ptr.dtype.element_ty), mask=out_mask)
    else:
        total = _partition(x_ptr, w_ptr, rm, rn, m_mask, n_mask, 0, K, stride_x,
                           BLOCKS_PER_PART, BLOCK_M, BLOCK_N, BLOCK_K, FP32_PRODUCTS, SQUASH)
        for p in range(1, PARTS):  # a loop, not unrolled: PARTS may be 40
            acc = _partition(x_ptr, w_ptr, rm, rn, m_mask, n_mask, p, K, stride_x,
                             BLOCKS_PER_PART, BLOCK_M, BLOCK_N, BLOCK_K, FP32_PRODUCTS, SQUASH)
            total = total + acc
        tl.store(y_ptr + offs, total.to(y_ptr.dtype.element_ty), mask=out_mask)


@triton.jit(do_not_specialize=["numel"])
def _sum_parts_kernel(ws_ptr, y_ptr, numel, PARTS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    total = add_partials(ws_ptr, offs, mask, numel.to(tl.int64), PARTS, "")
    tl.store(y_ptr + offs, total.to(y_ptr.dtype.element_ty), mask=mask)


def linear(
    x: torch.Tensor,
    w: torch.Tensor,
    out_dtype: torch.dtype | None = None,
    squash: int = 0,
    tile: dict | None = None,
) -> torch.Tensor:
    """x @ w.T. x: [..., K] (bf16 / fp16 / fp32); w: [N, K] of x's dtype -> [..., N].

    fp32 accumulation; the result of a row never depends on the call's other rows. out_dtype:
    None, x's dtype, or torch.float32: then x and w are read in their dtype and the fp32 sums
    stored unrounded (bf16 / fp16 on the tensor cores; with _TENSOR_CORE_FP32_OUT off, FMAs
    in fp32, bitwise `linear(x.float(), w.float())`).
    squash = hc > 0: the product of rowwise hc_squash(x, hc) (a hyper-connection's up
    projection), bitwise, with x's values squashed as they are loaded: one launch, and a
    2-D x may be a column slice (its rows strided). tile: tile_config's keys, to time or
    check another tile than (N, K)'s own (benchmarks/tune_linears.py).
    """
    k = x.shape[-1]
    n, kw = w.shape
    if kw != k:
        raise ValueError(f"linear: x has K={k}, w is {tuple(w.shape)}")
    if w.dtype != x.dtype:
        raise ValueError(f"linear: x is {x.dtype}, w is {w.dtype}")
    out_dtype = x.dtype if out_dtype is None else out_dtype
    if out_dtype not in (x.dtype, torch.float32):
        raise ValueError(f"linear: out_dtype {out_dtype} for {x.dtype} inputs")
    lead = x.shape[:-1]
    x2 = x if x.dim() == 2 and x.stride(-1) == 1 else x.reshape(-1, k).contiguous()
    w = w.contiguous()
    m = x2.shape[0]
    y = torch.empty((m, n), dtype=out_dtype, device=x.device)
    if m == 0 or n == 0:
        return y.reshape(*lead, n)
    if k == 0:
        return y.zero_().reshape(*lead, n)
    # fp32 out: the fp32 tiles and exact fp32 products, whatever the inputs' dtype
    fp32_products = x.dtype == torch.float32 or (
        out_dtype == torch.float32 and not _TENSOR_CORE_FP32_OUT)
    tile_dtype = torch.float32 if fp32_products else x.dtype
    cfg = tile or (tile_config if m <= DECODE_ROWS else prefill_tile)(n, k, tile_dtype)
    bm, bn, parts = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["PARTS"]
    m_tiles, n_tiles = triton.cdiv(m, bm), triton.cdiv(n, bn)
    split = parts > 1 and m_tiles * n_tiles < _IN_PROGRAM_TILES
    # None while a graph is captured before the counters exist: the second kernel adds
    count = counters(x.device, m_tiles * n_tiles) if split and _FIXUP else None
    meta = dict(
        PARTS=parts,
        BLOCKS_PER_PART=cfg["BLOCKS_PER_PART"],
        SPLIT=split,
        FIXUP=count is not None,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=cfg["BLOCK_K"],
        FP32_PRODUCTS=fp32_products,
        SQUASH=squash,
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )
    if _PDL and x.is_cuda:
        meta.update(PDL=True, launch_pdl=True)
    if not split:
        if cfg.get("FLAT", False):  # prefill_tile's one loop over every partition
            meta.update(FLAT=True)
        _linear_kernel[(m_tiles, n_tiles, 1)](x2, w, y, y, y, m, n, k, x2.stride(0), **meta)
        return y.reshape(*lead, n)
    ws = torch.empty((parts, m, n), dtype=torch.float32, device=x.device)
    _linear_kernel[(m_tiles, n_tiles, parts)](
        x2, w, y, ws, ws if count is None else count, m, n, k, x2.stride(0), **meta
    )
    if count is None:
        block = 1024
        _sum_parts_kernel[(triton.cdiv(m * n, block),)](
            ws, y, m * n, PARTS=parts, BLOCK=block, num_warps=4
        )
    return y.reshape(*lead, n)
