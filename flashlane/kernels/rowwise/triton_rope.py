"""Rotary position embedding, one Triton launch each (`reference.py`'s `cos_sin` and `rope`,
same signatures): a row's cos / sin from its position, and rotate-half RoPE of its heads.
`angles` and `rotated` are the device functions the fused kernels share (`triton_rows.py`'s
step angles, `triton_heads.py`'s norm_rope_heads), so every path rounds as `rope` does."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.pdl import enter, pdl
from flashlane.kernels.rowwise.triton import rounded


@triton.jit
def angles(pos, inv_ptr, cos_ptr, sin_ptr, R: tl.constexpr, RP2: tl.constexpr):
    """One row's cos and sin [R] at cos_ptr, sin_ptr for the (int) position pos."""
    cols = tl.arange(0, RP2)
    mask = cols < R
    dt: tl.constexpr = cos_ptr.dtype.element_ty
    inv = tl.load(inv_ptr + cols % (R // 2), mask=mask, other=0.0)
    angle = pos.to(tl.float32) * inv
    tl.store(cos_ptr + cols, tl.cos(angle).to(dt), mask=mask)
    tl.store(sin_ptr + cols, tl.sin(angle).to(dt), mask=mask)


@triton.jit
def _cos_sin_kernel(
    pos_ptr,
    inv_ptr,
    cos_ptr,
    sin_ptr,
    R: tl.constexpr,
    BLOCK: tl.constexpr,
    RP2: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    row = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + row)
    if BLOCK != 1:
        pos = (pos // BLOCK) * BLOCK  # positions are never negative: floor
    angles(pos, inv_ptr, cos_ptr + row * R, sin_ptr + row * R, R, RP2)


def cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype, block: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    n, r = positions.shape[0], 2 * inv_freq.shape[0]
    cos = torch.empty((n, r), dtype=dtype, device=positions.device)
    sin = torch.empty_like(cos)
    if n:
        _cos_sin_kernel[(n,)](positions.contiguous(), inv_freq, cos, sin, R=r, BLOCK=block,
                              RP2=triton.next_power_of_2(r), **pdl(cos.device))  # fmt: skip
    return cos, sin


@triton.jit
def rotated(x, other, cols, row, cos_ptr, sin_ptr, stride_c, R: tl.constexpr, dt: tl.constexpr):
    """Rotate-half RoPE of a head's fp32 values x (columns `cols`), `other` holding each
    rotated column's partner value (col +- R / 2) as read: `rope`'s arithmetic, each product
    rounded to dt; the columns past R are x."""
    rot = cols < R
    other = tl.where(cols < R // 2, -other, other)
    c = tl.load(cos_ptr + row * stride_c + cols, mask=rot, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + row * stride_c + cols, mask=rot, other=0.0).to(tl.float32)
    return tl.where(rot, rounded(x * c, dt) + rounded(other * s, dt), x)


@triton.jit(do_not_specialize=["heads", "stride_n", "stride_h", "stride_c"])
def _rope_kernel(
    x_ptr,
    cos_ptr,
    sin_ptr,
    y_ptr,
    heads,
    stride_n,
    stride_h,
    stride_c,
    D: tl.constexpr,
    R: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    rot = cols < R
    half: tl.constexpr = R // 2
    dt: tl.constexpr = y_ptr.dtype.element_ty
    src = x_ptr + row * stride_n + head * stride_h
    x = tl.load(src + cols, mask=mask, other=0.0).to(tl.float32)
    partner = tl.where(cols < half, cols + half, cols - half)
    other = tl.load(src + partner, mask=rot, other=0.0).to(tl.float32)
    y = rotated(x, other, cols, row, cos_ptr, sin_ptr, stride_c, R, dt)
    tl.store(y_ptr + (row * heads + head) * D + cols, y.to(dt), mask=mask)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    n, heads, d = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    y = torch.empty((n, heads, d), dtype=x.dtype, device=x.device)
    if n and heads:
        _rope_kernel[(n, heads)](
            x,
            cos,
            sin,
            y,
            heads,
            x.stride(0),
            x.stride(1),
            cos.stride(0),
            D=d,
            R=cos.shape[-1],
            BLOCK=triton.next_power_of_2(d),
            **pdl(x.device),
        )
    return y
