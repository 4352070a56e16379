"""Norm modules over the reference kernels (weights named as in the checkpoint)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from flashlane.kernels.norms.reference import gated_rms_norm, rms_norm


class RMSNorm(nn.Module):
    """Zero-centred RMSNorm `(1 + w)`; `group` normalises each run of `group` values alone."""

    def __init__(self, dim: int, eps: float, group: int | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps, self.group = eps, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, self.group)


class GatedRMSNorm(nn.Module):
    """The GDN output norm: plain weight `w` times act(gate)."""

    def __init__(self, dim: int, eps: float, activation: str):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps, self.activation = eps, activation

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return gated_rms_norm(x, gate, self.weight, self.eps, self.activation)


# The CPU's float64 GEMM takes a slower path for a row count that is not a multiple of 4
# (measured on the 192 x 8192 head: 7 rows 4.7 ms, 8 rows 1.7 ms), so rows are padded to one.
PAD_ROWS = 4
# Below this many weights the copy costs more than the slower path (measured: 192 x 64).
PAD_MIN_WEIGHTS = 65536


class Linear(nn.Linear):
    """nn.Linear that pads CPU float64 inputs [N, in] with zero rows to a multiple of
    PAD_ROWS. A row's result stays its own: the GEMM already ran at every N, and the CPU
    path's fp64 bits are rounded to fp32 (DESIGN.md section 1)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        if (
            x.dim() == 2
            and n > 2
            and n % PAD_ROWS
            and x.dtype == torch.float64
            and x.device.type == "cpu"
            and self.weight.numel() >= PAD_MIN_WEIGHTS
        ):
            pad = x.new_zeros(PAD_ROWS - n % PAD_ROWS, x.shape[1])
            return F.linear(torch.cat([x, pad]), self.weight, self.bias)[:n]
        return F.linear(x, self.weight, self.bias)


def linear(dim_in: int, dim_out: int) -> nn.Linear:
    return Linear(dim_in, dim_out, bias=False)
