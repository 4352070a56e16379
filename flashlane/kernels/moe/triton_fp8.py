"""Row-invariant Triton MoE over block-FP8 expert stacks; the CUDA kernel set's `moe` and
`moe_shared`, which take bf16 stacks (kernels/moe/triton.py's kernels) or Fp8Weight stacks.

FP8 experts run the bf16 path's grouped launches (routing, the expert-sorted layout, the
combine in rank order: kernels/moe/triton.py), with gate/up and down kernels that read e4m3
weights [E, N, K] and their scales [E, ceil(N/128), ceil(K/128)]: each K block of 128 is a
dot from zero in fp32 of x's dtype and the exactly converted e4m3 values, then added scaled
by its block's scale with one fma, in ascending K order (kernels/linear/triton_fp8.py's
arithmetic, without partitions: a tile runs all of K). A pair's row of a tile comes from its
own x row and its expert's weights alone, so it does not depend on which other pairs share the
tile; the roundings after the sums (gate x, up x, silu, product, down, each weighted slot, to
x's dtype) are the bf16 path's. The reference dequantizes (kernels/moe/reference.py).

A forward's prompt rows run in tiles of PROMPT_BLOCK_M pairs on wgmma, whatever their count
(one row too), and its decode rows on mma.sync: the two give other bits (kernels/row_kind.py
says why that keeps a row's bits its own); a forward of both kinds routes and runs each
kind's rows apart (`_kinds`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels import row_kind
from flashlane.kernels.linear.act_quant import act_quant, act_quant_ref
from flashlane.kernels.linear.fp8 import BLOCK, Fp8Weight
from flashlane.kernels.linear.triton import linear
from flashlane.kernels.linear.triton_fp8 import (
    block_scales,
    by_bits,
    column,
    pick,
    row_scales,
    scaled_dot,
)
from flashlane.kernels.moe import triton as dense_tr
from flashlane.kernels.moe import triton_pairs as pairs
from flashlane.kernels.moe.routing import dispatch
from flashlane.kernels.pdl import enter, pdl

# decode tiles (up to DECODE_ROWS rows, and every fp32 call) and prefill tiles: the bf16
# path's, with BLOCK_K the scale block
GATE_UP_TILE = dict(BLOCK_N=32, num_warps=4, num_stages=4)
DOWN_TILE = dict(BLOCK_N=64, num_warps=4, num_stages=3)
# prefill tiles of 32 rows, not the bf16 path's 64: a per-block dot from zero on wgmma (rows of
# 64) and on mma.sync (rows of 16 or 32) differs in a few elements of 10^5 on the H200
# (benchmarks/fp8_bits_probe.py, results/fp8_bits_probe_h200_9dea15f.txt), so every FP8 tile
# stays on mma.sync
PREFILL_BLOCK_M = 32
GATE_UP_PREFILL = dict(BLOCK_N=64, num_warps=4, num_stages=3, BLOCK_MAJOR=True)
DOWN_PREFILL = dict(BLOCK_N=128, num_warps=4, num_stages=3, BLOCK_MAJOR=True)
# prompt rows (kernels/row_kind.py): tiles of 64 pairs by 128 columns on 8 warps, on wgmma (no
# spills on sm_90: tests/kernels/test_sm90_compile_fp8.py); 6% faster at 8k rows on the H200
# than 64 / 128 columns on 4 warps, the same bits (fp8_prompt_rows_ae0ff91_20261205T052513Z)
PROMPT_BLOCK_M = 64
# the act's codes and scales made in the gate/up tile's store (prompt rows), not by act_quant
# after it: the same bits, a launch and the act's 16-bit round trip fewer. Not in Triton's
# interpreter, whose e4m3 cast is wrong (tests that correct it turn this on)
QUANT_IN_TILE = not triton.knobs.runtime.interpret
F8 = torch.float8_e4m3fn
TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}
GATE_UP_PROMPT = dict(BLOCK_N=128, num_warps=8, num_stages=3, BLOCK_MAJOR=True)
DOWN_PROMPT = dict(BLOCK_N=128, num_warps=8, num_stages=3, BLOCK_MAJOR=True)


@triton.jit
def _scaled(a, q_ptr, s, xs, w_base, rn, n_mask, rk, k_mask, K, acc, IEEE, BY_BITS, X_FP8):
    """acc + (a . q[rn, rk]) * s (the tile's scale_inv of this K block): one K block of one
    expert (`scaled_dot`; X_FP8: a is e4m3 codes, xs their rows' scales of the block)."""
    b = tl.load(
        q_ptr + w_base + rn[None, :].to(tl.int64) * K + rk[:, None],
        mask=n_mask[None, :] & k_mask[:, None],
        other=0.0,
    )
    return scaled_dot(a, b, s, xs, acc, IEEE, BY_BITS, X_FP8)


@triton.jit(do_not_specialize=["num_routed", "shared_id"])
def _gate_up_fp8_kernel(
    x_ptr, xs_ptr, gate_ptr, gate_s_ptr, up_ptr, up_s_ptr, act_ptr, acts_ptr, slot_pair_ptr,
    block_expert_ptr, H, I, HS, IS, num_routed, shared_id,
    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SCALES: tl.constexpr, IEEE: tl.constexpr, BLOCK_MAJOR: tl.constexpr = False,
    ONE_ROW: tl.constexpr = False, BY_BITS: tl.constexpr = False, X_FP8: tl.constexpr = False,
    PDL: tl.constexpr = 0, QUANT: tl.constexpr = None,
):  # fmt: skip
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    blk, pid_n = pairs._tile_ids(BLOCK_MAJOR)
    e, slots, pair = pairs._block(
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
    w_base = e * I * H
    s_base = e * IS * HS
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # the tile's scales, loaded once (kernels/linear/triton_fp8.py `block_scales`)
    nb = pid_n * BLOCK_N // BLOCK_K
    blocks = tl.cdiv(H, BLOCK_K)
    gate_s = block_scales(gate_s_ptr + s_base, nb, 0, blocks, HS, SCALES)
    up_s = block_scales(up_s_ptr + s_base, nb, 0, blocks, HS, SCALES)
    x_s = row_scales(xs_ptr, row, valid, HS, 0, HS, X_FP8, SCALES)
    for kb in range(0, blocks):
        a, rk, k_mask = pairs.x_block(x_ptr, row, valid, kb, H, BLOCK_K)
        sg, su = pick(gate_s, kb, SCALES), pick(up_s, kb, SCALES)
        xs = column(x_s, kb, SCALES)
        acc_g = _scaled(a, gate_ptr, sg, xs, w_base, rn, n_mask, rk, k_mask, H, acc_g,
                        IEEE, BY_BITS, X_FP8)  # fmt: skip
        acc_u = _scaled(a, up_ptr, su, xs, w_base, rn, n_mask, rk, k_mask, H, acc_u,
                        IEEE, BY_BITS, X_FP8)  # fmt: skip
    # x's dtype (QUANT: it, the act then e4m3 codes and scales as act_quant's, in this store)
    dt: tl.constexpr = act_ptr.dtype.element_ty if QUANT is None else QUANT
    g = acc_g.to(dt).to(tl.float32)
    u = acc_u.to(dt).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
    h = (s * u).to(dt)
    pairs.store_act(act_ptr, acts_ptr, h, slots, valid, rn, n_mask, I, IS, pid_n,
                    QUANT is not None)  # fmt: skip


@triton.jit(do_not_specialize=["num_routed", "shared_id"])
def _down_fp8_kernel(
    act_ptr, acts_ptr, down_ptr, down_s_ptr, y_ptr, slot_pair_ptr, block_expert_ptr,
    H, I, HS, IS, num_routed, shared_id,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SCALES: tl.constexpr,
    IEEE: tl.constexpr, BLOCK_MAJOR: tl.constexpr = False, ONE_ROW: tl.constexpr = False,
    BY_BITS: tl.constexpr = False, X_FP8: tl.constexpr = False, PDL: tl.constexpr = 0,
):  # fmt: skip
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    blk, pid_n = pairs._tile_ids(BLOCK_MAJOR)
    e, slots, pair = pairs._block(
        blk, slot_pair_ptr, block_expert_ptr, num_routed, shared_id, BLOCK_M, ONE_ROW
    )
    if e < 0:
        return
    valid = pair >= 0
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < H
    w_base = e * H * I
    s_base = e * HS * IS
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    blocks = tl.cdiv(I, BLOCK_K)
    down_s = block_scales(down_s_ptr + s_base, pid_n * BLOCK_N // BLOCK_K, 0, blocks, IS, SCALES)
    a_s = row_scales(acts_ptr, slots, valid, IS, 0, IS, X_FP8, SCALES)
    for kb in range(0, blocks):
        rk = kb * BLOCK_K + tl.arange(0, BLOCK_K)
        k_mask = rk < I
        a = tl.load(
            act_ptr + slots[:, None].to(tl.int64) * I + rk[None, :],
            mask=valid[:, None] & k_mask[None, :],
            other=0.0,
        )
        s, xs = pick(down_s, kb, SCALES), column(a_s, kb, SCALES)
        acc = _scaled(a, down_ptr, s, xs, w_base, rn, n_mask, rk, k_mask, I, acc, IEEE, BY_BITS,
                      X_FP8)  # fmt: skip
    tl.store(
        y_ptr + tl.where(valid, pair, 0).to(tl.int64)[:, None] * H + rn[None, :],
        acc.to(y_ptr.dtype.element_ty),
        mask=valid[:, None] & n_mask[None, :],
    )


def experts_fp8(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    gate: Fp8Weight,
    up: Fp8Weight,
    down: Fp8Weight,
    shared: tuple[torch.Tensor, torch.Tensor] | None = None,
    shared_logit: torch.Tensor | None = None,
    layout: tuple | None = None,
) -> torch.Tensor:
    """kernels/moe/triton.py's `experts` over FP8 stacks: gate, up [E, I, H], down [E, H, I]
    (Fp8Weight); x [N, H]; weights, ids [N, k]; shared / shared_logit / layout as there."""
    n, h = x.shape
    e, i, _ = gate.shape
    if up.shape != gate.shape or down.shape != (e, h, i):
        raise ValueError(f"moe: FP8 stacks {gate.shape}, {up.shape}, {down.shape} for H={h}")
    top_k = ids.shape[1]
    routed = e - (shared_logit is not None)
    out = torch.empty_like(x)
    if n == 0:
        return out
    x = x.contiguous()
    prompt = _is_prompt(n)
    if prompt:
        bm, gu, dn = PROMPT_BLOCK_M, GATE_UP_PROMPT, DOWN_PROMPT
    else:
        bm = dense_tr.pair_block(n, x.dtype, PREFILL_BLOCK_M)  # PREFILL_BLOCK_M: many rows
        prefill = bm == PREFILL_BLOCK_M
        gu, dn = (GATE_UP_PREFILL, DOWN_PREFILL) if prefill else (GATE_UP_TILE, DOWN_TILE)
    if BLOCK % gu["BLOCK_N"] or BLOCK % dn["BLOCK_N"]:  # a tile's scales: one row (block_scales)
        raise ValueError(f"moe: FP8 tiles' BLOCK_N must divide {BLOCK}: {gu}, {dn}")
    shared_rows = n if shared_logit is not None else 0
    # its pairs' experts differ: block b holds pair b (`_block`); a prompt row keeps its tile
    one_row = n == 1 and not prompt
    if one_row:
        slot_pair, block_expert = ids.flatten(), ids.flatten()
        blocks = top_k + shared_rows
    else:
        slot_pair, block_expert = dense_tr.laid_out(layout, bm) or dispatch(
            ids, routed, bm, shared_rows
        )
        blocks = block_expert.numel()
    hs, is_ = -(-h // BLOCK), -(-i // BLOCK)
    ieee, bits = x.dtype == torch.float32, by_bits(x) and not prompt
    quant = act_quant_ref if triton.knobs.runtime.interpret else act_quant
    # prompt rows: their activations in block FP8 too (kernels/linear/act_quant.py), the act's
    # quantized in the gate/up tile's store where a tile is one group
    fused = prompt and QUANT_IN_TILE and gu["BLOCK_N"] == BLOCK
    act = torch.empty((blocks * bm, i), dtype=F8 if fused else x.dtype, device=x.device)
    acts = torch.empty((blocks * bm, is_), dtype=torch.float32, device=x.device) if fused else act
    xq, xs = quant(x) if prompt else (x, x)
    _gate_up_fp8_kernel[pairs._grid(blocks, triton.cdiv(i, gu["BLOCK_N"]), gu)](
        xq, xs, gate.q.contiguous(), gate.scale_inv.contiguous(), up.q.contiguous(),
        up.scale_inv.contiguous(), act, acts, slot_pair, block_expert, h, i, hs, is_,
        n * top_k, routed, TOP_K=top_k, BLOCK_M=bm, BLOCK_K=BLOCK,
        SCALES=triton.next_power_of_2(hs), IEEE=ieee, ONE_ROW=one_row, BY_BITS=bits,
        X_FP8=prompt, QUANT=TL_DTYPES[x.dtype] if fused else None, **gu, **pdl(x.device),
    )  # fmt: skip
    y = torch.empty((n * top_k + shared_rows, h), dtype=x.dtype, device=x.device)
    aq, acts = (act, acts) if fused else quant(act) if prompt else (act, act)
    _down_fp8_kernel[pairs._grid(blocks, triton.cdiv(h, dn["BLOCK_N"]), dn)](
        aq, acts, down.q.contiguous(), down.scale_inv.contiguous(), y, slot_pair, block_expert,
        h, i, hs, is_, n * top_k, routed, BLOCK_M=bm, BLOCK_K=BLOCK,
        SCALES=triton.next_power_of_2(is_), IEEE=ieee, ONE_ROW=one_row, BY_BITS=bits,
        X_FP8=prompt, **dn,
        **pdl(y.device),
    )  # fmt: skip
    if shared_logit is not None:
        shared = (shared_logit, y[n * top_k :])
    g, s = shared if shared is not None else (out, out)  # unread without SHARED
    s = s.contiguous()
    pairs._combine_kernel[(n, triton.cdiv(h, pairs.COMBINE_BLOCK))](
        y, weights.contiguous(), out, g, s, h, g.stride(0), TOP_K=top_k,
        SHARED=shared is not None, BLOCK=pairs.COMBINE_BLOCK, num_warps=4,
        **pdl(out.device),
    )  # fmt: skip
    return out


def experts(
    x, weights, ids, gate, up, down, shared=None, shared_logit=None, layout=None
) -> torch.Tensor:
    """The grouped experts of bf16 stacks (kernels/moe/triton.py) or FP8 ones (experts_fp8)."""
    run = experts_fp8 if isinstance(gate, Fp8Weight) else dense_tr.experts
    return run(x, weights, ids, gate, up, down, shared, shared_logit, layout)


def moe(
    x: torch.Tensor,
    router: torch.Tensor,
    gate: torch.Tensor | Fp8Weight,
    up: torch.Tensor | Fp8Weight,
    down: torch.Tensor | Fp8Weight,
    top_k: int,
    normalize: bool,
    shared: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """reference.moe: x: [N, H]; router [E, H]; gate, up: [E, I, H]; down: [E, H, I] (bf16
    or Fp8Weight) -> [N, H]; with `shared` (gate logit [N, 1], output [N, H]) its gated add."""
    if _mixed(x, gate):
        rest = (router, gate, up, down, top_k, normalize)
        return _kinds(x, lambda a, b: moe(x[a:b], *rest, _rows(shared, a, b)))
    logits = linear(x, router, out_dtype=torch.float32)
    weights, ids, layout = _route(x, logits, top_k, normalize, 0, gate)
    return experts(x, weights, ids, gate, up, down, shared, layout=layout)


def moe_shared(
    x: torch.Tensor,
    router: torch.Tensor,
    gate: torch.Tensor | Fp8Weight,
    up: torch.Tensor | Fp8Weight,
    down: torch.Tensor | Fp8Weight,
    top_k: int,
    normalize: bool,
) -> torch.Tensor:
    """reference.moe_shared: router [E+1, H] (its last row the shared expert's gate), gate,
    up [E+1, I, H], down [E+1, H, I] (the last expert the shared one; bf16 or Fp8Weight):
    the shared expert is one more block of every grouped launch (kernels/moe/triton.py)."""
    if _mixed(x, gate):
        return _kinds(x, lambda a, b: moe_shared(x[a:b], router, gate, up, down, top_k, normalize))
    e = router.shape[0] - 1
    logits = linear(x, router, out_dtype=torch.float32, aligned=True)
    weights, ids, layout = _route(x, logits[:, :e], top_k, normalize, x.shape[0], gate)
    return experts(x, weights, ids, gate, up, down, shared_logit=logits[:, e:], layout=layout)


def _route(x, logits, top_k: int, normalize: bool, shared_rows: int, gate):
    """dense_tr.route_logits in the tiles of the experts that `gate`'s kind runs."""
    if not isinstance(gate, Fp8Weight):
        return dense_tr.route_logits(x, logits, top_k, normalize, shared_rows)
    if _is_prompt(x.shape[0]):
        args = (top_k, normalize, shared_rows, PROMPT_BLOCK_M)
        return dense_tr.route_logits(x, logits, *args, forced=True)
    return dense_tr.route_logits(x, logits, top_k, normalize, shared_rows, PREFILL_BLOCK_M)


def _is_prompt(n: int) -> bool:
    """Whether a call of n rows (of one kind: `_kinds` splits the others) is of prompt rows."""
    return row_kind.split(n)[0][2]


def _mixed(x: torch.Tensor, gate) -> bool:
    """Whether FP8 experts run x's rows of both kinds (kernels/row_kind.py)."""
    return isinstance(gate, Fp8Weight) and len(row_kind.split(x.shape[0])) > 1


def _kinds(x: torch.Tensor, run) -> torch.Tensor:
    """run(a, b) of each run of one kind's rows [a, b), routed and laid out apart, in row
    order."""
    outs = []
    for a, b, prompt in row_kind.split(x.shape[0]):
        with row_kind.uniform(prompt):
            outs.append(run(a, b))
    return torch.cat(outs)


def _rows(shared, a: int, b: int):
    """`shared` (gate logit, output) of rows [a, b), or None."""
    return None if shared is None else tuple(t[a:b] for t in shared)


def moe_placed(*args, **kwargs):
    """Expert parallel has no GPU kernels yet: the engine refuses --expert-parallel on CUDA
    before a model is built, so this is reached only by calling it directly."""
    raise NotImplementedError(
        "expert parallel runs on the CPU's reference kernels only; on GPUs the experts are "
        "split by tensor parallel (drop --expert-parallel)"
    )
