"""Linear and norm modules (weights named as in the checkpoint) over swappable kernels.

Each module calls its op through an attribute that `FlashNext.use_kernels` points at the
device's kernels (the references on the CPU, Triton on CUDA): the model code stays the same.
"""

from __future__ import annotations

import torch
from torch import nn

from flashlane.kernels.linear.fp8 import BLOCK, Fp8Weight, cat_rows
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

    FP8 linears (Fp8Weight) stack when every one but the last has a multiple of 128 rows
    (whole blocks of scales), else each runs alone; FP8 linears beside plain ones (the GDN's
    FP8 qkv and z beside its bf16 b and a) stack in runs of one kind, a product a run.

    Not a module: the linears stay the model's modules, with the checkpoint's names."""

    def __init__(self, *linears: Linear):
        self.linears = linears
        self.sizes = [m.out_features for m in linears]
        self.weight: torch.Tensor | Fp8Weight | None = None
        self.runs: list[Stacked] = []  # linears of one kind each, where kinds are mixed

    def stack(self) -> None:
        weights = [m.weight for m in self.linears]
        kinds = [isinstance(w, Fp8Weight) for w in weights]
        if len(set(kinds)) > 1:
            self.runs = []
            for i, kind in enumerate(kinds):
                if i == 0 or kind != kinds[i - 1]:
                    self.runs.append(Stacked(self.linears[i]))
                else:
                    run = self.runs[-1]
                    self.runs[-1] = Stacked(*run.linears, self.linears[i])
            for run in self.runs:
                run.stack()
            return
        if len(weights) == 1:
            return  # one linear is its own product
        if not any(kinds):
            w = torch.cat([w.detach() for w in weights])
            for m, part in zip(self.linears, w.split(self.sizes)):
                m.weight.data = part
            self.weight = w
            return
        fp8 = cat_rows(weights)
        if fp8 is None:
            return
        grid = [-(-n // BLOCK) for n in self.sizes]
        for m, q, s in zip(self.linears, fp8.q.split(self.sizes), fp8.scale_inv.split(grid)):
            m.weight.q.data, m.weight.scale_inv.data = q, s
        self.weight = fp8

    def stacked(self, x: torch.Tensor) -> torch.Tensor | Fp8Weight | None:
        """The one weight, if it still holds the linears' weights on x's device."""
        w = self.weight
        if w is None or w.data_ptr() != self.linears[0].weight.data_ptr() or w.device != x.device:
            return None
        return w

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.runs:
            return tuple(y for run in self.runs for y in run(x))
        w = self.stacked(x)
        if w is None:
            return tuple(m(x) for m in self.linears)
        return self.linears[0].op(x, w).split(self.sizes, dim=-1)


def linear(dim_in: int, dim_out: int) -> Linear:
    return Linear(dim_in, dim_out, bias=False)
