"""Row-invariant Triton MoE, same signature and semantics as `reference.moe`.

Router: fp32 logits through the row-invariant `linear` kernel (exact fp32 products), then
`routing.pick_experts`, one launch: softmax, top k (ties to the lower expert id) and
renormalisation with the k weights added in rank order. `routing.dispatch`'s layout sorts the
(row, slot) pairs by expert (stable) and pads each expert to BLOCK_M, at decode sizes in the
pick's launch (`route_logits`: routing.pick_and_lay_out), without a host sync: the buffers
are sized by the worst case (cdiv(pairs, BLOCK_M) + min(E, pairs) blocks) and unused blocks
exit at once. A call of one row (a lone step) needs no layout: its k experts differ, so
block b holds pair b alone in its first slot, as the layout would put it (`_block`), and the
tiles and bits are the same.

Experts as a grouped GEMM over those expert-sorted pairs (their blocks and the combine:
`triton_pairs.py`, shared with the FP8 experts):

* gate/up kernel, grid (pair blocks, I / BLOCK_N): silu(x gate^T) * (x up^T) -> act [slots, I]
* down kernel, grid (pair blocks, H / BLOCK_N): act down^T -> y [pairs, H] (scattered by pair)
* combine, grid (rows, H / BLOCK): out = y0*w0; out = out + y1*w1; ... in rank order.

Each pair's row of a tile is computed from its own x row and its expert's weights only, with
one ascending K loop, so it does not depend on which other pairs share the tile (nor where in
the tile it sits). The tile's shape follows the call's rows like the linear's (decode tiles
up to linear.DECODE_ROWS rows, wgmma tiles of 64 pairs above, bf16 / fp16 only): the K loop
runs the same tensor-core k-steps in the same order in both, which gave the same bits on the
H200 (kernels/linear/triton.py; tests/kernels/test_triton_moe.py checks rows alone against
the same rows in 150). Intermediate roundings follow the reference:
gate x, up x, silu, the product, down and every weighted slot are rounded to x's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.linear.triton import DECODE_ROWS, linear
from flashlane.kernels.moe.routing import dispatch, pick_and_lay_out, pick_experts
from flashlane.kernels.moe.triton_pairs import (
    BLOCK_M,
    COMBINE_BLOCK,
    PREFILL_BLOCK_M,
    _block,
    _combine_kernel,
    _grid,
    _tile_ids,
    x_block,
)
from flashlane.kernels.pdl import enter, pdl

# the tile sweep's winners at Flash Next's expert shape (benchmarks/results/
# tune_decode_kernels_h200.log, H200: gate/up 17.2 against 24.0 us at 1 row and faster at
# 4, 16 and 64 rows; down + combine equal at 1 row, faster at 4-64)
GATE_UP_TILE = dict(BLOCK_N=32, BLOCK_K=128, num_warps=4, num_stages=4)
DOWN_TILE = dict(BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3)
# above DECODE_ROWS rows (prompt chunks): PREFILL_BLOCK_M pairs a tile on wgmma, a block's
# column tiles launched together (`_tile_ids`)
GATE_UP_PREFILL = dict(BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=3, BLOCK_MAJOR=True)
DOWN_PREFILL = dict(BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=3, BLOCK_MAJOR=True)


def route(
    x: torch.Tensor, router: torch.Tensor, top_k: int, normalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k experts per row. x: [N, H]; router: [E, H].

    Returns (weights [N, k] in x's dtype, ids [N, k] int64), ids in rank order.
    """
    logits = linear(x, router, out_dtype=torch.float32)
    return pick_experts(logits, top_k, normalize, x.dtype)


def pair_block(n: int, dtype: torch.dtype, prefill: int = PREFILL_BLOCK_M) -> int:
    """Pairs a tile of the grouped launches for a call of n rows of x's dtype: `prefill`
    (the experts' prompt tile: the FP8 ones' is another) above DECODE_ROWS rows."""
    return prefill if n > DECODE_ROWS and dtype != torch.float32 else BLOCK_M


def route_logits(
    x: torch.Tensor,
    logits: torch.Tensor,
    top_k: int,
    normalize: bool,
    shared_rows: int,
    prefill: int = PREFILL_BLOCK_M,
    forced: bool = False,
):
    """The rows' experts from fp32 router logits [N, E] -> (weights [N, k], ids [N, k], the
    pairs' layout (slot_pair, block_expert, block_m) for `experts`, or None): for more than
    one row laid out in the pick's launch (routing.pick_and_lay_out), in tiles of
    pair_block(N, x's dtype, prefill) pairs (forced: of `prefill` pairs whatever N); one
    row needs none."""
    if x.shape[0] <= 1:
        return *pick_experts(logits, top_k, normalize, x.dtype), None
    bm = prefill if forced else pair_block(x.shape[0], x.dtype, prefill)
    weights, ids, *layout = pick_and_lay_out(logits, top_k, normalize, x.dtype, bm, shared_rows)
    return weights, ids, (*layout, bm)


def laid_out(layout: tuple | None, block_m: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """route_logits' layout (slot_pair, block_expert) for experts in tiles of block_m pairs
    (None: none given)."""
    if layout is None:
        return None
    if layout[2] != block_m:
        raise ValueError(f"moe: pairs laid out in blocks of {layout[2]}, tiles of {block_m}")
    return layout[0], layout[1]


@triton.jit(do_not_specialize=["num_routed", "shared_id"])
def _gate_up_kernel(
    x_ptr,
    gate_ptr,
    up_ptr,
    act_ptr,
    slot_pair_ptr,
    block_expert_ptr,
    H,
    I,
    num_routed,
    shared_id,
    TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_MAJOR: tl.constexpr = False,
    ONE_ROW: tl.constexpr = False,
    PDL: tl.constexpr = 0,
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    blk, pid_n = _tile_ids(BLOCK_MAJOR)
    e, slots, pair = _block(
        blk, slot_pair_ptr, block_expert_ptr, num_routed, shared_id, BLOCK_M, ONE_ROW
    )
    if e < 0:
        return
    valid = pair >= 0
    # a routed pair is row * TOP_K + slot; the shared expert's pairs follow, one a row
    row = tl.where(pair < num_routed, pair // TOP_K, pair - num_routed)
    row = tl.where(valid, row, 0).to(tl.int64)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < I
    w_base = e.to(tl.int64) * I * H
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(H, BLOCK_K)):
        a, rk, k_mask = x_block(x_ptr, row, valid, kb, H, BLOCK_K)
        w_offs = w_base + rn[None, :].to(tl.int64) * H + rk[:, None]
        w_mask = n_mask[None, :] & k_mask[:, None]
        g = tl.load(gate_ptr + w_offs, mask=w_mask, other=0.0)
        u = tl.load(up_ptr + w_offs, mask=w_mask, other=0.0)
        acc_g = tl.dot(a, g, acc_g, input_precision=PRECISION)
        acc_u = tl.dot(a, u, acc_u, input_precision=PRECISION)
    dt = act_ptr.dtype.element_ty
    g = acc_g.to(dt).to(tl.float32)
    u = acc_u.to(dt).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
    h = (s * u).to(dt)
    tl.store(
        act_ptr + slots[:, None].to(tl.int64) * I + rn[None, :],
        h,
        mask=valid[:, None] & n_mask[None, :],
    )


@triton.jit(do_not_specialize=["num_routed", "shared_id"])
def _down_kernel(
    act_ptr,
    down_ptr,
    y_ptr,
    slot_pair_ptr,
    block_expert_ptr,
    H,
    I,
    num_routed,
    shared_id,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_MAJOR: tl.constexpr = False,
    ONE_ROW: tl.constexpr = False,
    PDL: tl.constexpr = 0,
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    blk, pid_n = _tile_ids(BLOCK_MAJOR)
    e, slots, pair = _block(
        blk, slot_pair_ptr, block_expert_ptr, num_routed, shared_id, BLOCK_M, ONE_ROW
    )
    if e < 0:
        return
    valid = pair >= 0
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < H
    w_base = e.to(tl.int64) * H * I
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(I, BLOCK_K)):
        rk = kb * BLOCK_K + tl.arange(0, BLOCK_K)
        k_mask = rk < I
        a = tl.load(
            act_ptr + slots[:, None].to(tl.int64) * I + rk[None, :],
            mask=valid[:, None] & k_mask[None, :],
            other=0.0,
        )
        w = tl.load(
            down_ptr + w_base + rn[None, :].to(tl.int64) * I + rk[:, None],
            mask=n_mask[None, :] & k_mask[:, None],
            other=0.0,
        )
        acc = tl.dot(a, w, acc, input_precision=PRECISION)
    tl.store(
        y_ptr + tl.where(valid, pair, 0).to(tl.int64)[:, None] * H + rn[None, :],
        acc.to(y_ptr.dtype.element_ty),
        mask=valid[:, None] & n_mask[None, :],
    )


def experts(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    gate: torch.Tensor,
    up: torch.Tensor,
    down: torch.Tensor,
    shared: tuple[torch.Tensor, torch.Tensor] | None = None,
    shared_logit: torch.Tensor | None = None,
    layout: tuple | None = None,
) -> torch.Tensor:
    """sum_j weights[:, j] * swiglu_{ids[:, j]}(x), added in rank order, then with `shared`
    (gate logit [N, 1], s [N, H]) + sigmoid(gate logit) * s in the same launch. x: [N, H].
    shared_logit [N, 1] (fp32 or x's dtype) in place of `shared`: the last expert of gate,
    up, down is the shared expert, which every row takes in the same grouped launches, and
    its output s is added so. layout: the pairs' (slot_pair, block_expert, block_m) from
    `route_logits` (else laid out here: routing.dispatch)."""
    n, h = x.shape
    e, i, _ = gate.shape
    top_k = ids.shape[1]
    routed = e - (shared_logit is not None)
    out = torch.empty_like(x)
    if n == 0:
        return out
    x = x.contiguous()
    gate, up, down = gate.contiguous(), up.contiguous(), down.contiguous()
    bm = pair_block(n, x.dtype, PREFILL_BLOCK_M)  # a prompt chunk, on wgmma tiles
    prefill = bm == PREFILL_BLOCK_M
    gu, dn = (GATE_UP_PREFILL, DOWN_PREFILL) if prefill else (GATE_UP_TILE, DOWN_TILE)
    shared_rows = n if shared_logit is not None else 0
    one_row = n == 1  # its pairs' experts differ: block b holds pair b (`_block`)
    if one_row:
        slot_pair, block_expert = ids.flatten(), ids.flatten()
        blocks = top_k + shared_rows
    else:
        slot_pair, block_expert = laid_out(layout, bm) or dispatch(ids, routed, bm, shared_rows)
        blocks = block_expert.numel()
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    act = torch.empty((blocks * bm, i), dtype=x.dtype, device=x.device)
    _gate_up_kernel[_grid(blocks, triton.cdiv(i, gu["BLOCK_N"]), gu)](
        x,
        gate,
        up,
        act,
        slot_pair,
        block_expert,
        h,
        i,
        n * top_k,
        routed,
        TOP_K=top_k,
        BLOCK_M=bm,
        PRECISION=precision,
        ONE_ROW=one_row,
        **gu,
        **pdl(x.device),
    )
    y = torch.empty((n * top_k + shared_rows, h), dtype=x.dtype, device=x.device)
    _down_kernel[_grid(blocks, triton.cdiv(h, dn["BLOCK_N"]), dn)](
        act,
        down,
        y,
        slot_pair,
        block_expert,
        h,
        i,
        n * top_k,
        routed,
        BLOCK_M=bm,
        PRECISION=precision,
        ONE_ROW=one_row,
        **dn,
        **pdl(y.device),
    )
    if shared_logit is not None:
        shared = (shared_logit, y[n * top_k :])
    g, s = shared if shared is not None else (out, out)  # unread without SHARED
    s = s.contiguous()
    _combine_kernel[(n, triton.cdiv(h, COMBINE_BLOCK))](
        y, weights.contiguous(), out, g, s, h, g.stride(0), TOP_K=top_k,
        SHARED=shared is not None, BLOCK=COMBINE_BLOCK, num_warps=4, **pdl(out.device),
    )  # fmt: skip
    return out


def moe(
    x: torch.Tensor,
    router: torch.Tensor,
    gate: torch.Tensor,
    up: torch.Tensor,
    down: torch.Tensor,
    top_k: int,
    normalize: bool,
    shared: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """reference.moe: x: [N, H]; gate, up: [E, I, H]; down: [E, H, I] -> [N, H]; with
    `shared` (gate logit [N, 1], the shared expert's output) its gated add too."""
    logits = linear(x, router, out_dtype=torch.float32)
    weights, ids, layout = route_logits(x, logits, top_k, normalize, 0)
    return experts(x, weights, ids, gate, up, down, shared, layout=layout)


def moe_shared(
    x: torch.Tensor,
    router: torch.Tensor,
    gate: torch.Tensor,
    up: torch.Tensor,
    down: torch.Tensor,
    top_k: int,
    normalize: bool,
) -> torch.Tensor:
    """reference.moe_shared: the routed experts and the gated shared expert in the same
    launches. router [E+1, H] (its last row the shared expert's gate), gate, up [E+1, I, H],
    down [E+1, H, I] (the last expert the shared one). The router's product gives the
    shared gate's logit as its last column; the shared expert is one more block of every
    grouped launch (each row a pair of expert E), so it costs no launch of its own."""
    e = router.shape[0] - 1
    logits = linear(x, router, out_dtype=torch.float32, aligned=True)
    weights, ids, layout = route_logits(x, logits[:, :e], top_k, normalize, x.shape[0])
    return experts(x, weights, ids, gate, up, down, shared_logit=logits[:, e:], layout=layout)
