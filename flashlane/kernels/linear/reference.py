"""The linear product on the CPU: F.linear, with float64 rows padded to a multiple of 4.

The CPU's float64 GEMM takes a slower path for a row count that is not a multiple of 4
(measured on the 192 x 8192 head: 7 rows 4.7 ms, 8 rows 1.7 ms), so rows are padded to one.
A row's result stays its own: the GEMM already ran at every row count, and the CPU path's
fp64 bits are rounded to fp32 (DESIGN.md section 1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flashlane.kernels.linear.fp8 import Fp8Weight, dense

PAD_ROWS = 4
# Below this many weights the copy costs more than the slower path (measured: 192 x 64).
PAD_MIN_WEIGHTS = 65536


def linear(x: torch.Tensor, w: torch.Tensor | Fp8Weight) -> torch.Tensor:
    """x @ w.T for x [..., K], w [N, K] (an Fp8Weight: dequantized to x's dtype first)."""
    w = dense(w, x.dtype)
    n = x.shape[0]
    if (
        x.dim() == 2
        and n > 2
        and n % PAD_ROWS
        and x.dtype == torch.float64
        and x.device.type == "cpu"
        and w.numel() >= PAD_MIN_WEIGHTS
    ):
        pad = x.new_zeros(PAD_ROWS - n % PAD_ROWS, x.shape[1])
        return F.linear(torch.cat([x, pad]), w)[:n]
    return F.linear(x, w)
