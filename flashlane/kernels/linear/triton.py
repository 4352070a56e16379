"""Row-invariant Triton GEMM: `linear(x, w) = x @ w.T`, a row's bits the same whatever M.

Row invariance (a row's output is bitwise the same whatever M, its offset and the other rows):

* K is cut into PARTS fixed partitions (spans of K); PARTS and the spans depend only on
  (N, K, dtype); each partition accumulates its K in ascending order from zero in fp32, and
  the partitions are added in ascending order: `((p0 + p1) + p2) + ...`;
* the tile's shape (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) follows the call's row count
  (`tiles.py` `row_tile`: `tile_config` up to DECODE_ROWS rows, in rows of 16 up to 16
  rows, `prefill_tile` above), never the partitions. A product's bits depend on the
  partitions and on the tensor cores' k-steps of 16, which run in the same order in every
  tile: on the H200 every tile of `benchmarks/tune_linears.py` (BLOCK_M 16 on mma.sync, 64
  and 128 on wgmma, BLOCK_N 64/128, BLOCK_K 64/128, 4/8 warps) gave the same bits for the
  same spans, normal and exponent-spread inputs, and tests/kernels/test_triton_dense.py
  checks a row alone against the same row in 200.

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
`all_partitions`): the same sums in the same order as the loop over partitions.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.linear.partitions import all_partitions, partition_sum
from flashlane.kernels.linear.prefetch import prefetch_rows, prefetch_span
from flashlane.kernels.linear.tiles import DECODE_ROWS, prefill_tile, row_tile, shaped, tile_config
from flashlane.kernels.partials import add_partials, counters, last_to_arrive
from flashlane.kernels.pdl import enter, pdl

# partition_sum and the prefetch helpers (partitions.py, prefetch.py) re-exported from here
__all__ = [
    "DECODE_ROWS",
    "linear",
    "partition_sum",
    "prefetch_rows",
    "prefetch_span",
    "prefill_tile",
    "tile_config",
]

# a squashed product's rows are padded to a multiple of this many values
_ALIGN = 16
# row tiles x column tiles from which one program runs all partitions
_IN_PROGRAM_TILES = 128
# split partitions added by each tile's last program (`kernels/partials.py`), not a 2nd kernel
_FIXUP = True
# bf16 / fp16 inputs with fp32 out (the router) on the tensor cores: exact bf16 products
# summed in fp32 by the bf16 tiles, row-invariant like every bf16 product, within 3.4e-7 of
# the largest logit of the FMA chains' exact fp32 sums, and 7.5x faster at 2,048 rows on the
# H200 (437 -> 59 us). False: FMA chains on the CUDA cores, bitwise linear(x.float(), ...)
_TENSOR_CORE_FP32_OUT = True


@triton.jit
def _stored(total, cols, squash_cols, SQUASH: tl.constexpr, dt: tl.constexpr):
    """The value stored for fp32 sums `total` in columns `cols`: y, the sums rounded to dt,
    and with SQUASH = hc, in columns under squash_cols, silu(y / hc), each op rounded as
    rowwise hc_squash rounds it (a hyper-connection's down projection, whose up projection
    reads it)."""
    y = total.to(dt)
    if SQUASH > 0:
        h = (y.to(tl.float32) / SQUASH).to(dt).to(tl.float32)
        y = tl.where(cols < squash_cols, (h / (1.0 + tl.exp(-h))).to(dt), y)
    return y


@triton.jit(do_not_specialize=["M", "prefetch", "squash_cols"])
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
    stride_y,
    prefetch,
    squash_cols,
    PARTS: tl.constexpr,
    BLOCKS_PER_PART: tl.constexpr,
    SPLIT: tl.constexpr,
    FIXUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FP32_PRODUCTS: tl.constexpr,
    SQUASH: tl.constexpr,
    PDL: tl.constexpr = 0,
    FLAT: tl.constexpr = 0,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # a constexpr and a runtime test in one `and` would not fold the constexpr away
    if PDL:  # noqa: SIM102 (the weights nothing writes, into L2 while the kernel before runs)
        if prefetch > 0:
            k0 = tl.program_id(2) * BLOCKS_PER_PART * BLOCK_K if SPLIT else 0
            elem: tl.constexpr = w_ptr.dtype.element_ty.primitive_bitwidth // 8
            prefetch_rows(w_ptr, rn, N, K, k0, prefetch, elem)
    enter(PDL)  # then nothing is read or written before the kernel before has finished
    m_mask = rm < M
    n_mask = rn < N
    out_mask = m_mask[:, None] & n_mask[None, :]
    offs = rm[:, None].to(tl.int64) * N + rn[None, :]  # the partials' planes
    offs_y = rm[:, None].to(tl.int64) * stride_y + rn[None, :]
    dt: tl.constexpr = y_ptr.dtype.element_ty
    if SPLIT:
        part = tl.program_id(2)
        acc = partition_sum(
            x_ptr,
            w_ptr,
            rm,
            rn,
            m_mask,
            n_mask,
            part,
            K,
            stride_x,
            BLOCKS_PER_PART,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
            FP32_PRODUCTS,
        )
        plane = M.to(tl.int64) * N
        tl.store(ws_ptr + part * plane + offs, acc, mask=out_mask)
        # a constexpr and a runtime test in one `and` would not fold the constexpr away
        if FIXUP:  # noqa: SIM102
            if last_to_arrive(count_ptr + pid_m * tl.num_programs(1) + pid_n, PARTS):
                total = add_partials(ws_ptr, offs, out_mask, plane, PARTS, ".cg")
                tl.store(
                    y_ptr + offs_y,
                    _stored(total, rn[None, :], squash_cols, SQUASH, dt),
                    mask=out_mask,
                )
    elif FLAT:
        # FLAT 1: one loop, a select at every block; 2: a branch at each partition's end
        total = all_partitions(
            x_ptr,
            w_ptr,
            rm,
            rn,
            m_mask,
            n_mask,
            K,
            stride_x,
            BLOCKS_PER_PART,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
            FP32_PRODUCTS,
            FLAT == 2,
        )
        tl.store(
            y_ptr + offs_y, _stored(total, rn[None, :], squash_cols, SQUASH, dt), mask=out_mask
        )
    else:
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
        for p in range(1, PARTS):  # a loop, not unrolled: PARTS may be 40
            acc = partition_sum(
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
            total = total + acc
        tl.store(
            y_ptr + offs_y, _stored(total, rn[None, :], squash_cols, SQUASH, dt), mask=out_mask
        )


@triton.jit(do_not_specialize=["numel", "n", "squash_cols"])
def _sum_parts_kernel(
    ws_ptr,
    y_ptr,
    numel,
    n,
    stride_y,
    squash_cols,
    PARTS: tl.constexpr,
    SQUASH: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    total = add_partials(ws_ptr, offs, mask, numel.to(tl.int64), PARTS, "")
    y = _stored(total, offs % n, squash_cols, SQUASH, y_ptr.dtype.element_ty)
    tl.store(y_ptr + (offs // n) * stride_y + offs % n, y, mask=mask)


def linear(
    x: torch.Tensor,
    w: torch.Tensor,
    out_dtype: torch.dtype | None = None,
    squash: tuple[int, int] | None = None,
    tile: dict | None = None,
    aligned: bool = False,
) -> torch.Tensor:
    """x @ w.T. x: [..., K] (bf16 / fp16 / fp32); w: [N, K] of x's dtype -> [..., N].

    fp32 accumulation; the result of a row never depends on the call's other rows. out_dtype:
    None, x's dtype, or torch.float32: then x and w are read in their dtype and the fp32 sums
    stored unrounded (bf16 / fp16 on the tensor cores; with _TENSOR_CORE_FP32_OUT off, FMAs
    in fp32, bitwise `linear(x.float(), w.float())`).
    squash = (cols, hc): the output's first `cols` columns stored as rowwise
    hc_squash(y, hc) of the rounded product y, bitwise (a hyper-connection's down
    projection, `rowwise.triton_hc.hc_down`), in the same launch; its rows are then padded
    to a multiple of 16 values (y is a column slice of a wider buffer), so that the up
    projection, which reads the squashed columns as a slice, gets 16-byte aligned rows (a
    row stride of 324 values made it load 2-byte scalars: 353 against 128 us at 8,192 rows
    on the H200). aligned: rows so padded without a squash (the MoE's router with its
    shared gate column: the route kernel's loads keep the layout, and its sums the order,
    of a 512-wide row). A 2-D x may be a column slice (its rows strided). tile: tile_config's
    keys, to time or check another tile than (N, K)'s own (benchmarks/tune_linears.py).
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
    squash_cols, hc = squash or (0, 0)
    if squash is not None and (hc <= 0 or not 0 <= squash_cols <= n):
        raise ValueError(f"linear: squash {squash} for {n} columns")
    lead = x.shape[:-1]
    x2 = x if x.dim() == 2 and x.stride(-1) == 1 else x.reshape(-1, k).contiguous()
    w = w.contiguous()
    m = x2.shape[0]
    width = -(-n // _ALIGN) * _ALIGN if squash is not None or aligned else n
    y = torch.empty((m, width), dtype=out_dtype, device=x.device)[:, :n]
    if m == 0 or n == 0:
        return y.reshape(*lead, n)
    if k == 0:
        return y.zero_().reshape(*lead, n)
    # fp32 out: the fp32 tiles and exact fp32 products, whatever the inputs' dtype
    fp32_products = x.dtype == torch.float32 or (
        out_dtype == torch.float32 and not _TENSOR_CORE_FP32_OUT
    )
    tile_dtype = torch.float32 if fp32_products else x.dtype
    cfg = tile or row_tile(m, n, k, tile_dtype)
    bm, bn, parts = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["PARTS"]
    m_tiles, n_tiles = triton.cdiv(m, bm), triton.cdiv(n, bn)
    # a tile's SPLIT (False: every partition in its program) overrides the row-tile count's
    split = parts > 1 and cfg.get("SPLIT", m_tiles * n_tiles < _IN_PROGRAM_TILES)
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
        SQUASH=hc,
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )
    launch = pdl(x.device)
    meta.update(launch)
    ahead = prefetch_span(w, cfg, m, n_tiles, parts if split else 1) if launch else 0
    if not split:
        if cfg.get("FLAT", False):  # prefill_tile's one loop over every partition
            meta.update(FLAT=int(cfg["FLAT"]))
        _linear_kernel[(m_tiles, n_tiles, 1)](
            x2, w, y, y, y, m, n, k, x2.stride(0), y.stride(0), ahead, squash_cols, **meta
        )
        return shaped(y, lead)
    ws = torch.empty((parts, m, n), dtype=torch.float32, device=x.device)
    _linear_kernel[(m_tiles, n_tiles, parts)](
        x2,
        w,
        y,
        ws,
        ws if count is None else count,
        m,
        n,
        k,
        x2.stride(0),
        y.stride(0),
        ahead,
        squash_cols,
        **meta,
    )
    if count is None:
        block = 1024
        _sum_parts_kernel[(triton.cdiv(m * n, block),)](
            ws,
            y,
            m * n,
            n,
            y.stride(0),
            squash_cols,
            PARTS=parts,
            SQUASH=hc,
            BLOCK=block,
            num_warps=4,
        )
    return shaped(y, lead)
