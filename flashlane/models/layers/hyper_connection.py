"""Hyper-connections: hc residual streams replace every pre-norm and the final norm.

R: [N, hc*H]. Per block: xn = grouped_rmsnorm(R); mix = sigmoid(up(silu(down(xn) / hc)));
the block reads a = mean_c(mix_c * xn_c); its output y is added to every stream with its own
weight w = 2 sigmoid(inject(xn) / hc): R = R + y (x) w.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from flashlane.models.layers.norms import RMSNorm, linear


class HyperConnection(nn.Module):
    def __init__(self, hidden: int, hc: int, lowrank: int, eps: float, inject: bool = True):
        super().__init__()
        self.hidden, self.hc = hidden, hc
        self.hc_norm = RMSNorm(hc * hidden, eps, group=hidden)
        self.input_mix_weight_down = linear(hc * hidden, lowrank)
        self.input_mix_weight_up = linear(lowrank, hc * hidden)
        self.block_inject_weight = linear(hc * hidden, hc) if inject else None

    def read(self, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """R [N, hc*H] -> (block input a [N, H], write weights w [N, hc] or None for the mixer)."""
        xn = self.hc_norm(r)
        mix = torch.sigmoid(
            self.input_mix_weight_up(F.silu(self.input_mix_weight_down(xn) / self.hc))
        )
        a = mean_of_streams((mix * xn).unflatten(-1, (self.hc, self.hidden)))
        if self.block_inject_weight is None:
            return a, None
        return a, 2 * torch.sigmoid(self.block_inject_weight(xn) / self.hc)

    @staticmethod
    def write(r: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """R + y (x) w: y [N, H] added to each stream c with weight w[:, c]."""
        return r + (y.unsqueeze(-2) * w.unsqueeze(-1)).flatten(-2)


def mean_of_streams(x: torch.Tensor) -> torch.Tensor:
    """[N, hc, H] -> [N, H]: the streams added in order, then divided. Elementwise adds, so a
    row's result does not depend on the row count (a reduction kernel may change its order)."""
    total = x[:, 0]
    for c in range(1, x.shape[1]):
        total = total + x[:, c]
    return total / x.shape[1]
