"""One K block of an FP8 expert's product (kernels/moe/triton_fp8.py's kernels): the e4m3
weight tile's dot with the pairs' activations (bf16, or for prompt rows e4m3 codes with their
rows' scales: kernels/linear/act_quant.py), scaled by the tile's block scale in one fma."""

from __future__ import annotations

import triton
import triton.language as tl

from flashlane.kernels.linear.triton_fp8 import weight_operand

__all__ = ["column", "row_scales", "scaled"]


@triton.jit
def scaled(a, q_ptr, s, xs, w_base, rn, n_mask, rk, k_mask, K, acc, IEEE, BY_BITS, X_FP8):
    """acc + (a . q[rn, rk]) * s (the tile's scale_inv of this K block): one K block of one
    expert. X_FP8: a is e4m3 codes and xs [BLOCK_M] their rows' scales of the block
    (kernels/linear/act_quant.py), the dot on e4m3 tensor cores, one fma by xs * s."""
    b = tl.load(
        q_ptr + w_base + rn[None, :].to(tl.int64) * K + rk[:, None],
        mask=n_mask[None, :] & k_mask[:, None],
        other=0.0,
    )
    if X_FP8:
        if IEEE:
            p = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        else:
            p = tl.dot(a, b)
        out = tl.fma(p, xs[:, None] * s, acc)
    else:
        if IEEE:
            p = tl.dot(a, b.to(tl.float32), input_precision="ieee")
        else:
            p = tl.dot(a, weight_operand(b, a, BY_BITS))
        out = tl.fma(p, s, acc)
    return out


@triton.jit
def row_scales(xs_ptr, rows, valid, KS, X_FP8: tl.constexpr, SCALES: tl.constexpr):
    """With X_FP8 the rows' activation scales [BLOCK_M, SCALES], loaded before the K loop;
    else zeros (unread)."""
    j = tl.arange(0, SCALES)
    if X_FP8:
        at = valid[:, None] & (j[None, :] < KS)
        out = tl.load(xs_ptr + rows[:, None].to(tl.int64) * KS + j[None, :], mask=at, other=0.0)
    else:
        out = tl.zeros((rows.shape[0], SCALES), dtype=tl.float32)
    return out


@triton.jit
def column(scales, kb, SCALES: tl.constexpr):
    """scales[:, kb], exactly (one value and zeros summed a row)."""
    return tl.sum(tl.where(tl.arange(0, SCALES)[None, :] == kb, scales, 0.0), axis=1)
