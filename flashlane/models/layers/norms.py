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
    # A tensor-parallel rank's linear holds a slice of the weight; parallel/plan.py sets
    # `combine` where the slices' outputs meet: the sum over ranks (a row-parallel output
    # projection) or the concatenation (a vocab-parallel head). None: the whole weight.
    combine = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.op(x, self.weight)
        return y if self.combine is None else self.combine(y)


class Stacked:
    """Linears that read the same input, as one product. After `stack()` their weights are
    row blocks (views) of one [sum N, K] weight, and one call of the kernels' linear serves
    them all: one launch in place of several at decode, where a launch costs more than the
    work. Until then (training, or a model not yet given its kernels), or if the weights
    were moved since, each runs alone with the same results up to the GEMM's summation
    order (row invariance holds either way: the tile depends on the shape alone).

    Not a module: the linears stay the model's modules, with the checkpoint's names."""

    def __init__(self, *linears: Linear):
        self.linears = linears
        self.sizes = [m.out_features for m in linears]
        self.weight: torch.Tensor | None = None

    def stack(self) -> None:
        w = torch.cat([m.weight.detach() for m in self.linears])
        for m, part in zip(self.linears, w.split(self.sizes)):
            m.weight.data = part
        self.weight = w

    def stacked(self, x: torch.Tensor) -> torch.Tensor | None:
        """The one weight, if it still holds the linears' weights on x's device."""
        w = self.weight
        if w is None or w.data_ptr() != self.linears[0].weight.data_ptr() or w.device != x.device:
            return None
        return w

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        w = self.stacked(x)
        if w is None:
            return tuple(m(x) for m in self.linears)
        return self.linears[0].op(x, w).split(self.sizes, dim=-1)


def linear(dim_in: int, dim_out: int) -> Linear:
    return Linear(dim_in, dim_out, bias=False)
