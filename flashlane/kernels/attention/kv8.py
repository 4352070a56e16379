"""The 8-bit attention cache (--kv-cache-dtype fp8): e4m3 values with an fp32 scale per
stored row (and head), so that each row's stored bits depend on that row alone and a stream's
cache is the same whatever ran beside it (DESIGN.md section 1).

quantize: scale = max(amax / 448, SCALE_FLOOR) over the row's last dimension (a head's D
values of K or V, or an indexer key's Di), values x / scale rounded to e4m3 (448 is e4m3's
largest finite value; the floor keeps a zero row's scale finite, so it stores exact zeros;
torch on a GPU divides by the host scalar 448 as a multiply by fp32(1 / 448), on the CPU
exactly: triton_kv8.py's store follows the GPU's).
dequantize: e4m3 -> fp32, times the scale (one correctly rounded fp32 product, the same bits
in torch and in a Triton load), then the compute dtype: the kernels compute on those values
as they would on a cache stored in the compute dtype.
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
# the smallest normal fp32: amax / 448 of a row of denormal-small values still divides finely
SCALE_FLOOR = torch.finfo(torch.float32).tiny


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] (any float dtype) -> (e4m3 [..., D], fp32 scale [...]), per row of D."""
    amax = x.abs().amax(-1).float()
    scale = (amax / FP8_MAX).clamp_(min=SCALE_FLOOR)
    # (x / scale: fp32 whatever x's dtype, which converts to fp32 exactly or is fp64, then
    # rounded; the quotient of the row's largest value may round a hair past 448: clamp, so
    # that it never converts to NaN)
    q = (x / scale.unsqueeze(-1)).float().clamp_(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """e4m3 [..., D] and fp32 scale [...] -> [..., D] in dtype (fp32 product, then rounded)."""
    return (q.float() * scale.unsqueeze(-1)).to(dtype)
