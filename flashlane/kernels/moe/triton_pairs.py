"""The grouped MoE launches' pair blocks, shared by the bf16 (`triton.py`) and block-FP8
(`triton_fp8.py`) experts: which pair block and column tile a program computes, which expert
and pairs a block holds, and the combine that adds a row's weighted slots in rank order.
"""

from __future__ import annotations

import triton
import triton.language as tl

from flashlane.kernels.linear.act_quant import e4m3_groups
from flashlane.kernels.pdl import enter

# pairs a tile at decode (up to DECODE_ROWS rows, and every fp32 call)
BLOCK_M = 16
# pairs a tile above DECODE_ROWS rows (prompt chunks, wgmma)
PREFILL_BLOCK_M = 64
COMBINE_BLOCK = 1024


@triton.jit
def _tile_ids(BLOCK_MAJOR: tl.constexpr):
    """(pair block, column tile) of this program. The launch order is the grid's first axis
    fastest: column tiles first under BLOCK_MAJOR (a block's x rows are read once from DRAM
    and its expert's weights by its neighbouring blocks at once), else pair blocks first.
    Which program computes a tile never changes its bits."""
    if BLOCK_MAJOR:
        return tl.program_id(1), tl.program_id(0)
    return tl.program_id(0), tl.program_id(1)


@triton.jit
def _block(
    blk,
    slot_pair_ptr,
    block_expert_ptr,
    num_routed,
    shared_id,
    BLOCK_M: tl.constexpr,
    ONE_ROW: tl.constexpr,
):
    """Block blk's expert (-1: an unused block), slots and pairs (-1: an empty slot). The
    dispatch layout's; with ONE_ROW (a call of one row, whose k experts differ), pair blk
    alone in its block's first slot, as the layout puts it: expert ids[blk] for one of the
    num_routed routed pairs (block_expert_ptr holds the ids), the shared expert (shared_id)
    after them."""
    lanes = tl.arange(0, BLOCK_M)
    slots = blk * BLOCK_M + lanes
    if ONE_ROW:
        routed = tl.load(block_expert_ptr + tl.minimum(blk, num_routed - 1))
        e = tl.where(blk < num_routed, routed, shared_id).to(tl.int64)
        pair = tl.where(lanes == 0, blk, -1)
    else:
        e = tl.load(block_expert_ptr + blk).to(tl.int64)
        pair = tl.load(slot_pair_ptr + slots)
    return e, slots, pair


@triton.jit
def store_act(act_ptr, acts_ptr, h, slots, valid, rn, n_mask, I, IS, group, QUANT: tl.constexpr):
    """The gate/up tile's h [BLOCK_M, BLOCK_N] (x's dtype) at act[slots, rn]; QUANT (the tile
    one group of 128 columns, `group`): as act_quant's e4m3 codes of h, its rows' scales at
    acts[slots, group] (act_quant's `e4m3_groups`: the same bits)."""
    mask = valid[:, None] & n_mask[None, :]
    at = act_ptr + slots[:, None].to(tl.int64) * I + rn[None, :]
    if QUANT:  # columns past I hold 0, as act_quant reads them
        q, scale = e4m3_groups(h.to(tl.float32))
        tl.store(at, q.to(act_ptr.dtype.element_ty), mask=mask)
        tl.store(acts_ptr + slots.to(tl.int64) * IS + group, scale, mask=valid)
    else:
        tl.store(at, h, mask=mask)


@triton.jit
def _combine_kernel(
    y_ptr,
    w_ptr,
    out_ptr,
    gate_ptr,
    s_ptr,
    H,
    stride_gate,
    TOP_K: tl.constexpr,
    SHARED: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < H
    dt = out_ptr.dtype.element_ty
    base = row * TOP_K
    w0 = tl.load(w_ptr + base).to(tl.float32)
    out = (tl.load(y_ptr + base * H + cols, mask=mask, other=0.0).to(tl.float32) * w0).to(dt)
    for j in tl.static_range(1, TOP_K):
        wj = tl.load(w_ptr + base + j).to(tl.float32)
        yj = tl.load(y_ptr + (base + j) * H + cols, mask=mask, other=0.0).to(tl.float32)
        out = (out.to(tl.float32) + (yj * wj).to(dt).to(tl.float32)).to(dt)
    if SHARED:  # + sigmoid(gate) * s, each op rounded as rowwise gated_add's
        # (a logit in fp32, the router's column, is rounded to dt first: the model's logit)
        g = tl.load(gate_ptr + row * stride_gate).to(dt).to(tl.float32)
        g = (1.0 / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        s = tl.load(s_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)
        out = (out.to(tl.float32) + (g * s).to(dt).to(tl.float32)).to(dt)
    tl.store(out_ptr + row * H + cols, out, mask=mask)


def _grid(blocks: int, n_tiles: int, tile: dict) -> tuple[int, int]:
    return (n_tiles, blocks) if tile.get("BLOCK_MAJOR") else (blocks, n_tiles)


@triton.jit
def x_block(x_ptr, row, valid, kb, H, BLOCK_K: tl.constexpr):
    """K block kb of the tile's pairs' x rows [BLOCK_M, BLOCK_K] (empty slots' as zeros), its
    columns rk and their mask: (a, rk, k_mask)."""
    rk = kb * BLOCK_K + tl.arange(0, BLOCK_K)
    k_mask = rk < H
    a = tl.load(
        x_ptr + row[:, None] * H + rk[None, :], mask=valid[:, None] & k_mask[None, :], other=0.0
    )
    return a, rk, k_mask
