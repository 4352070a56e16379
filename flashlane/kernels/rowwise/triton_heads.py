"""A QSA layer's heads made ready in one launch: the queries, keys and indexer queries each
normed (norms/triton.py's zero-centred RMSNorm over a head's D values) and roped
(triton.py's rope), where a decode step ran six small launches in a chain (~1 us each on the
H200).

A program is one (row, head) of one part; it computes a column's normed value and its rope
partner's from x with rms_norm's arithmetic (the same factor over the head, the same block
and warps, rounded to the dtype), then rope's. Elementwise ops on the same values, so the
bits are those of rms_norm then rope.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.norms.triton import _warps, rms_factor
from flashlane.kernels.pdl import enter, pdl
from flashlane.kernels.rowwise.triton import rounded
from flashlane.kernels.rowwise.triton_rope import rotated

PARTS = 3  # parts a launch (q, k, the indexer's q); more take more launches


@triton.jit
def _norm_rope_head(
    x_ptr,
    w_ptr,
    y_ptr,
    row,
    head,
    heads,
    stride_n,
    stride_h,
    cos_ptr,
    sin_ptr,
    stride_c,
    eps,
    D: tl.constexpr,
    R: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One head of D values: rms_norm's normed value of each column and of its partner
    (rounded to the dtype, as rms_norm stores them), then _rope_kernel's rotation."""
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    rot = cols < R
    half: tl.constexpr = R // 2
    dt: tl.constexpr = y_ptr.dtype.element_ty
    src = x_ptr + row * stride_n + head * stride_h
    x = tl.load(src + cols, mask=mask, other=0.0).to(tl.float32)
    r = rms_factor(x, D, eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    x = rounded((x * r) * (1.0 + w), dt)
    partner = tl.where(cols < half, cols + half, cols - half)
    other = tl.load(src + partner, mask=rot, other=0.0).to(tl.float32)
    wp = tl.load(w_ptr + partner, mask=rot, other=0.0).to(tl.float32)
    other = rounded((other * r) * (1.0 + wp), dt)
    y = rotated(x, other, cols, row, cos_ptr, sin_ptr, stride_c, R, dt)
    tl.store(y_ptr + (row * heads + head) * D + cols, y.to(dt), mask=mask)


@triton.jit(do_not_specialize=["sn0", "sh0", "sn1", "sh1", "sn2", "sh2", "stride_c"])
def _norm_rope_heads_kernel(
    x0,
    w0,
    y0,
    sn0,
    sh0,
    eps0,
    x1,
    w1,
    y1,
    sn1,
    sh1,
    eps1,
    x2,
    w2,
    y2,
    sn2,
    sh2,
    eps2,
    cos_ptr,
    sin_ptr,
    stride_c,
    H0: tl.constexpr,
    H1: tl.constexpr,
    H2: tl.constexpr,
    D0: tl.constexpr,
    D1: tl.constexpr,
    D2: tl.constexpr,
    B0: tl.constexpr,
    B1: tl.constexpr,
    B2: tl.constexpr,
    R: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    # grid (rows, H0 + H1 + H2): part 0's heads, then part 1's, then part 2's; each part
    # (x, weight, out y, x's row and head strides, eps) with its heads H, width D, block B
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    if head < H0:
        _norm_rope_head(
            x0, w0, y0, row, head, H0, sn0, sh0, cos_ptr, sin_ptr, stride_c, eps0, D0, R, B0
        )
    elif head < H0 + H1:
        _norm_rope_head(
            x1, w1, y1, row, head - H0, H1, sn1, sh1, cos_ptr, sin_ptr, stride_c, eps1, D1, R, B1
        )
    else:
        _norm_rope_head(
            x2,
            w2,
            y2,
            row,
            head - H0 - H1,
            H2,
            sn2,
            sh2,
            cos_ptr,
            sin_ptr,
            stride_c,
            eps2,
            D2,
            R,
            B2,
        )


def norm_rope_heads(
    parts: list[tuple[torch.Tensor, torch.Tensor, float]], cos: torch.Tensor, sin: torch.Tensor
) -> list[torch.Tensor]:
    """rowwise.reference.norm_rope_heads, up to three parts a launch, each x read where it
    lies (its heads' values contiguous; else a copy). The same bits as rms_norm then rope."""
    cos, sin = cos.contiguous(), sin.contiguous()
    out = []
    for i in range(0, len(parts), PARTS):
        out += _launch(parts[i : i + PARTS], cos, sin)
    return out


def _launch(parts, cos, sin) -> list[torch.Tensor]:
    n = cos.shape[0]
    args, sizes, ys = [], {}, []
    for i, (x, w, eps) in enumerate(parts):
        x = x if x.stride(-1) == 1 else x.contiguous()
        ys.append(torch.empty(x.shape, dtype=x.dtype, device=x.device))
        block = triton.next_power_of_2(x.shape[-1])
        args += [x, w.contiguous(), ys[-1], x.stride(0), x.stride(1), eps]
        sizes.update({f"H{i}": x.shape[1], f"D{i}": x.shape[-1], f"B{i}": block})
    # rms_norm's warps (a head's sum of squares reduced in its order): one count for all
    warps = {_warps(sizes[f"B{i}"]) for i in range(len(parts))}
    if len(warps) > 1:  # widths of different warps: a launch each
        return [y for part in parts for y in _launch([part], cos, sin)]
    for i in range(len(parts), PARTS):  # absent parts: no heads
        args += args[:6]
        sizes.update({f"H{i}": 0, f"D{i}": sizes["D0"], f"B{i}": sizes["B0"]})
    heads = sum(sizes[f"H{i}"] for i in range(PARTS))
    if n and heads:
        _norm_rope_heads_kernel[(n, heads)](
            *args,
            cos,
            sin,
            cos.stride(0),
            R=cos.shape[-1],
            num_warps=warps.pop(),
            **sizes,
            **pdl(cos.device),
        )
    return ys
