"""The grouped MoE launches' pair blocks, shared by the bf16 (`triton.py`) and block-FP8
(`triton_fp8.py`) experts: which pair block and column tile a program computes, which expert
and pairs a block holds, and the combine that adds a row's weighted slots in rank order (in
the down launch at decode rows, else in a launch of its own: `combine_args`).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from flashlane.kernels import partials
from flashlane.kernels.pdl import enter, pdl

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
def combined(
    y_ptr, w_ptr, gate_ptr, s_ptr, row, cols, mask, H, stride_gate,
    TOP_K: tl.constexpr, SHARED: tl.constexpr, dt: tl.constexpr, CACHE: tl.constexpr,
):  # fmt: skip
    """Rows `row`'s weighted slots y * w added in rank order, then (SHARED) + sigmoid(gate) *
    s, each op rounded to dt as the reference rounds it, at columns cols. row: an int64
    scalar (with cols [C]) or [R, 1] (with cols [1, C]): every op is per element, so a
    tile's bits are the one-row combine's. CACHE: the loads of y and s (".cg" where other
    programs of the launch wrote them)."""
    base = row * TOP_K
    w0 = tl.load(w_ptr + base).to(tl.float32)
    y0 = tl.load(y_ptr + base * H + cols, mask=mask, other=0.0, cache_modifier=CACHE)
    out = (y0.to(tl.float32) * w0).to(dt)
    for j in tl.static_range(1, TOP_K):
        wj = tl.load(w_ptr + base + j).to(tl.float32)
        yj = tl.load(y_ptr + (base + j) * H + cols, mask=mask, other=0.0, cache_modifier=CACHE)
        out = (out.to(tl.float32) + (yj.to(tl.float32) * wj).to(dt).to(tl.float32)).to(dt)
    if SHARED:  # + sigmoid(gate) * s, each op rounded as rowwise gated_add's
        # (a logit in fp32, the router's column, is rounded to dt first: the model's logit)
        g = tl.load(gate_ptr + row * stride_gate).to(dt).to(tl.float32)
        g = (1.0 / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        sv = tl.load(s_ptr + row * H + cols, mask=mask, other=0.0, cache_modifier=CACHE)
        out = (out.to(tl.float32) + (g * sv.to(tl.float32)).to(dt).to(tl.float32)).to(dt)
    return out


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
    dt: tl.constexpr = out_ptr.dtype.element_ty
    out = combined(
        y_ptr, w_ptr, gate_ptr, s_ptr, row, cols, mask, H, stride_gate, TOP_K, SHARED, dt, ""
    )
    tl.store(out_ptr + row * H + cols, out, mask=mask)


@triton.jit
def combine_arrived(
    pair, valid, pid_n, n_tiles, count_ptr, num_routed, y_ptr, w_ptr, out_ptr, gate_ptr,
    s_ptr, rn, n_mask, H, stride_gate,
    TOP_K: tl.constexpr, SHARED: tl.constexpr, ARRIVALS: tl.constexpr,
):  # fmt: skip
    """The combine in the down launch that stored y (a decode call's): once a program's y
    tile is stored, each of its pairs counts one arrival at (the pair's row, column tile
    pid_n); the program that brings a row's ARRIVALS-th (its k routed pairs and, when the
    shared expert is one of the launch's, its shared pair) adds that row's tile as the
    combine launch would (`combined`, the same bits); partials.last_to_arrive counts and
    resets, and y is read through L2 (".cg")."""
    row = tl.where(pair < num_routed, pair // TOP_K, pair - num_routed)
    row = tl.where(valid, row, 0).to(tl.int64)
    last = partials.last_to_arrive(count_ptr + row * n_tiles + pid_n, ARRIVALS, valid)
    dt: tl.constexpr = out_ptr.dtype.element_ty
    r = tl.where(last, row, 0)[:, None]
    mask = last[:, None] & n_mask[None, :]
    out = combined(
        y_ptr, w_ptr, gate_ptr, s_ptr, r, rn[None, :], mask, H, stride_gate, TOP_K, SHARED,
        dt, ".cg",
    )  # fmt: skip
    tl.store(out_ptr + r * H + rn[None, :], out, mask=mask)


def _grid(blocks: int, n_tiles: int, tile: dict) -> tuple[int, int]:
    return (n_tiles, blocks) if tile.get("BLOCK_MAJOR") else (blocks, n_tiles)


def combine_args(y, weights, out, shared, top_k: int, shared_expert: bool, n_tiles: int, fuse):
    """The down launch's combine arguments (its trailing ones): with `fuse` (a decode call
    outside a capture that would miss the counters) and the device's counters, the down
    launch combines (`combine_arrived`, COMBINE) and no combine launch follows; else
    COMBINE off and `combine` launches it (always with FLASHLANE_COMBINE_LAUNCH=1, for an
    A/B). shared: (gate logit [N, 1], s [N, H]) or None; shared_expert: s is the launch's
    own shared pairs (one more arrival a row)."""
    n = out.shape[0]
    fuse = fuse and os.environ.get("FLASHLANE_COMBINE_LAUNCH", "0") != "1"
    g, s = shared if shared is not None else (out, out)  # unread without SHARED
    count = None
    if fuse and n * n_tiles <= partials.NUM_COUNTERS:
        count = partials.counters(out.device, n * n_tiles)
    args = (weights.contiguous(), out, g, s.contiguous(), y if count is None else count)
    consts = dict(
        stride_gate=g.stride(0), n_tiles=n_tiles, TOP_K=top_k, SHARED=shared is not None,
        ARRIVALS=top_k + shared_expert, COMBINE=count is not None,
    )  # fmt: skip
    return args, consts


def combine(y, args, consts) -> None:
    """The combine launch, where the down launch did not combine (`combine_args`)."""
    if consts["COMBINE"]:
        return
    w, out, g, s, _ = args
    n, h = out.shape
    _combine_kernel[(n, triton.cdiv(h, COMBINE_BLOCK))](
        y, w, out, g, s, h, consts["stride_gate"], TOP_K=consts["TOP_K"],
        SHARED=consts["SHARED"], BLOCK=COMBINE_BLOCK, num_warps=4, **pdl(out.device),
    )  # fmt: skip
