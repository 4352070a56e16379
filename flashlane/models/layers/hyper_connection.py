"""Hyper-connections: hc residual streams replace every pre-norm and the final norm.

R: [N, hc*H]. Per block: xn = grouped_rmsnorm(R); mix = sigmoid(up(silu(down(xn) / hc)));
the block reads a = mean_c(mix_c * xn_c); its output y is added to every stream with its own
weight w = 2 sigmoid(inject(xn) / hc): R = R + y (x) w. down and inject read the same xn, so
they run as one product (the kernels' hc_down, which squashes down's columns as it stores
them); up and the mix are one launch too (hc_up_mix); the write is hc_write.
"""

from __future__ import annotations

import torch
from torch import nn

from flashlane.kernels import REFERENCE, Kernels
from flashlane.models.layers.norms import RMSNorm, Stacked, linear


class HyperConnection(nn.Module):
    def __init__(self, hidden: int, hc: int, lowrank: int, eps: float, inject: bool = True):
        super().__init__()
        self.hidden, self.hc, self.lowrank = hidden, hc, lowrank
        self.hc_norm = RMSNorm(hc * hidden, eps, group=hidden)
        self.input_mix_weight_down = linear(hc * hidden, lowrank)
        self.input_mix_weight_up = linear(lowrank, hc * hidden)
        self.block_inject_weight = linear(hc * hidden, hc) if inject else None
        self.down = Stacked(
            *(m for m in (self.input_mix_weight_down, self.block_inject_weight) if m is not None)
        )
        self.ops: Kernels = REFERENCE  # FlashNext.use_kernels points it at the device's

    def read(
        self, r: torch.Tensor, xn: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """R [N, hc*H] -> (block input a [N, H], write weights w [N, hc] or None for the mixer).
        xn: R's norm when the write before made it (write_norm)."""
        ops, low = self.ops, self.lowrank
        xn = self.hc_norm(r) if xn is None else xn
        w = self.down.stacked(xn)
        if w is not None:  # down and inject as one product
            both = ops.hc_down(xn, w, low, self.hc)
            squashed, inject = both[:, :low], (both[:, low:] if both.shape[1] > low else None)
        else:
            squashed = ops.hc_down(xn, self.input_mix_weight_down.weight, low, self.hc)
            inj = self.block_inject_weight
            inject = None if inj is None else inj(xn)
        return ops.hc_up_mix(squashed, self.input_mix_weight_up.weight, xn, inject, self.hc)

    def write(self, r: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """R + y (x) w: y [N, H] added to each stream c with weight w[:, c]."""
        return self.ops.hc_write(r, y, w)

    def write_norm(
        self, r, y, w, then: HyperConnection, rows: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """write(), and `then`'s norm of the result for its read, in one launch; rows [B]:
        of those rows alone, each in its own run of N / B (kernels.hc_write_norm)."""
        norm = then.hc_norm
        return self.ops.hc_write_norm(r, y, w, norm.weight, norm.eps, rows)
