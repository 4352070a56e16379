"""Partial rotary embedding (rotate-half) on the leading `rotary_dim` dims of each head.

Text positions only: with equal temporal/height/width positions, the interleaved mRoPE of the
checkpoint equals plain RoPE. Angles are computed in fp32 as the reference does (the fp32
rounding of position * inv_freq is part of the model's numerics), then cast.
"""

from __future__ import annotations

import torch

from flashlane.kernels.rowwise.reference import cos_sin, rope


class Rotary:
    def __init__(self, rotary_dim: int, theta: float):
        self.rotary_dim = rotary_dim
        exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim
        self.inv_freq = 1.0 / (theta**exponents)
        self._on: dict[torch.device, torch.Tensor] = {}  # inv_freq copied once per device
        self.op = cos_sin

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype, block: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [N] (each rounded down to a multiple of `block` first) -> cos, sin
        [N, rotary_dim], through `op` (the kernels' cos_sin; FlashNext.use_kernels sets it)."""
        return self.op(positions, self.inv(positions.device), dtype, block)

    def inv(self, device: torch.device) -> torch.Tensor:
        """inv_freq on `device` (copied there once)."""
        inv = self._on.get(device)
        if inv is None:
            inv = self._on[device] = self.inv_freq.to(device)
        return inv


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [N, heads, D]; cos, sin: [N, R] with R <= D even -> x with its first R dims rotated.
    (The reference; the model's layers call their kernels' `rope`.)"""
    return rope(x, cos, sin)
