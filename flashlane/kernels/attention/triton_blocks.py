"""The indexer's block keys in one launch: pool (the block's raw keys added in order in fp32,
divided, rounded), the zero-centred RMSNorm and RoPE, as reference.block_keys with the
Triton norms' and rowwise rope's arithmetic. `pool_block_at` is the same math for the block
that holds a device-side position (the lone step), written in place: the two share one
function, so a lone step and a shared round give a block the same bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.norms.triton import rms_factor


@triton.jit
def _block_key(raw_ptr, cos_ptr, sin_ptr, w_ptr, out_ptr, eps,
               BLOCK: tl.constexpr, DI: tl.constexpr, R: tl.constexpr, BDI: tl.constexpr):
    """raw_ptr: the block's BLOCK rows of DI; cos_ptr, sin_ptr: its R values; out_ptr: DI."""
    cols = tl.arange(0, BDI)
    mask = cols < DI
    dt: tl.constexpr = out_ptr.dtype.element_ty
    total = tl.load(raw_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    for j in tl.static_range(1, BLOCK):
        total = total + tl.load(raw_ptr + j * DI + cols, mask=mask, other=0.0).to(tl.float32)
    x = (total / BLOCK).to(dt).to(tl.float32)
    r = rms_factor(x, DI, eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = ((x * r) * (1.0 + w)).to(dt).to(tl.float32)
    # the same normed row, each rotated dim's partner (rotate-half)
    half: tl.constexpr = R // 2
    rot = cols < R
    partner = tl.where(cols < half, cols + half, cols - half)
    xp = tl.load(raw_ptr + partner, mask=rot, other=0.0).to(tl.float32)
    for j in tl.static_range(1, BLOCK):
        xp = xp + tl.load(raw_ptr + j * DI + partner, mask=rot, other=0.0).to(tl.float32)
    yp = ((((xp / BLOCK).to(dt).to(tl.float32)) * r) * (1.0 + tl.load(
        w_ptr + partner, mask=rot, other=0.0).to(tl.float32))).to(dt).to(tl.float32)
    yp = tl.where(cols < half, -yp, yp)
    c = tl.load(cos_ptr + cols, mask=rot, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + cols, mask=rot, other=0.0).to(tl.float32)
    both = (y * c).to(dt).to(tl.float32) + (yp * s).to(dt).to(tl.float32)
    tl.store(out_ptr + cols, tl.where(rot, both, y).to(dt), mask=mask)


@triton.jit(do_not_specialize=["stride_raw", "stride_out"])
def _block_keys_kernel(raw_ptr, cos_ptr, sin_ptr, w_ptr, out_ptr, stride_raw, stride_out, eps,
                       BLOCK: tl.constexpr, DI: tl.constexpr, R: tl.constexpr,
                       BDI: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1).to(tl.int64)
    _block_key(raw_ptr + b * stride_raw + n * BLOCK * DI, cos_ptr + n * R, sin_ptr + n * R,
               w_ptr, out_ptr + b * stride_out + n * DI, eps, BLOCK, DI, R, BDI)


@triton.jit(do_not_specialize=["nb"])
def _pool_block_at_kernel(keys_ptr, cos_ptr, sin_ptr, w_ptr, out_ptr, pos_ptr, nb, eps,
                          BLOCK: tl.constexpr, DI: tl.constexpr, R: tl.constexpr,
                          BDI: tl.constexpr):
    b = tl.load(pos_ptr).to(tl.int64) // BLOCK
    if b < nb:
        _block_key(keys_ptr + b * BLOCK * DI, cos_ptr, sin_ptr, w_ptr, out_ptr + b * DI, eps,
                   BLOCK, DI, R, BDI)


def _meta(block: int, di: int, cos: torch.Tensor) -> dict:
    return dict(BLOCK=block, DI=di, R=cos.shape[-1], BDI=triton.next_power_of_2(di))


def block_keys(raw_keys, cos, sin, weight, eps: float, block: int) -> torch.Tensor:
    b, n, di = raw_keys.shape
    nb = n // block
    raw = raw_keys[:, : nb * block].contiguous()
    out = torch.empty((b, nb, di), dtype=raw_keys.dtype, device=raw_keys.device)
    if b and nb:
        _block_keys_kernel[(b, nb)](
            raw, cos.contiguous(), sin.contiguous(), weight.contiguous(), out, raw.stride(0),
            out.stride(0), eps, **_meta(block, di, cos),
        )
    return out


def pool_block_at(index_keys, out, pos, cos, sin, weight, eps: float, block: int) -> None:
    if out.shape[0] == 0:
        return
    _pool_block_at_kernel[(1,)](
        index_keys, cos.contiguous(), sin.contiguous(), weight.contiguous(), out, pos,
        out.shape[0], eps, **_meta(block, index_keys.shape[-1], cos),
    )
