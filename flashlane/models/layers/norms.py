"""Linear and norm modules (weights named as in the checkpoint) over swappable kernels.

Each module calls its op through an attribute that `FlashNext.use_kernels` points at the
device's kernels (the references on the CPU, Triton on CUDA): the model code stays the same.
"""

from __future__ import annotations

import torch
from torch import nn

from flashlane.kernels.linear.reference import linear as linear_ref
from flashlane.kernels.norms.reference import gated_rms_norm, rms_norm


class RMSNorm(nn.Module):
    """Zero-centred RMSNorm `(1 + w)`; `group` normalises each run of `group` values alone."""

    def __init__(self, dim: int, eps: float, group: int | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps, self.group = eps, group

    op = staticmethod(rms_norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x, self.weight, self.eps, self.group)


class GatedRMSNorm(nn.Module):
    """The GDN output norm: plain weight `w` times act(gate)."""

    def __init__(self, dim: int, eps: float, activation: str):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps, self.activation = eps, activation

    op = staticmethod(gated_rms_norm)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return self.op(x, gate, self.weight, self.eps, self.activation)


class Linear(nn.Linear):
    """A bias-free linear layer whose product is the kernels' `linear` (row-invariant on
    CUDA, where cuBLAS picks its algorithm by the row count)."""

    op = staticmethod(linear_ref)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x, self.weight)


def linear(dim_in: int, dim_out: int) -> Linear:
    return Linear(dim_in, dim_out, bias=False)
