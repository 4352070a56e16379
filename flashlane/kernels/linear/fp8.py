"""A block-FP8 weight kept as FP8 on the device: what a linear or an expert stack holds in
place of its bf16 weight when the model is served in FP8 (`models/fp8_weights.py` decides).

The values are the checkpoint's (models/fp8.py's semantics): `q` [..., N, K] e4m3 and
`scale_inv` [..., ceil(N/128), ceil(K/128)] float32, one scale per 128 x 128 block, so the
weight's real value is `q * scale_inv` per block. The kernels' `linear` and `moe` take one
wherever they take a bf16 weight: the Triton ones read the e4m3 bytes and apply the scales to
their fp32 sums (kernels/linear/triton_fp8.py, kernels/moe/triton_fp8.py); the references
dequantize (`dense`) and compute as for a plain weight.

A module, not a frozen record, so that `.to(device)`, `parameters()` (the engine's weight
bytes) and `state_dict()` (`<name>.q`, `<name>.scale_inv`) see its two tensors.
"""

from __future__ import annotations

import torch
from torch import nn

# the scale block of every block-FP8 checkpoint of this family (the kernels' BLOCK_K too)
BLOCK = 128
FP8_DTYPE = torch.float8_e4m3fn


def scale_grid(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The scale shape of a weight of `shape` [..., N, K]: [..., ceil(N/128), ceil(K/128)]."""
    *lead, n, k = shape
    return (*lead, -(-n // BLOCK), -(-k // BLOCK))


class Fp8Weight(nn.Module):
    """q [..., N, K] float8_e4m3fn, scale_inv [..., ceil(N/128), ceil(K/128)] float32."""

    def __init__(self, q: torch.Tensor, scale_inv: torch.Tensor):
        super().__init__()
        if q.dtype != FP8_DTYPE or q.ndim < 2:
            raise ValueError(f"Fp8Weight: q must be 2+-dim float8_e4m3fn, got {q.dtype} {q.shape}")
        if scale_inv.dtype != torch.float32 or tuple(scale_inv.shape) != scale_grid(q.shape):
            raise ValueError(
                f"Fp8Weight: scale_inv {scale_inv.dtype} {tuple(scale_inv.shape)} for q "
                f"{tuple(q.shape)}: expected float32 {scale_grid(q.shape)} (128x128 blocks)"
            )
        self.q = nn.Parameter(q, requires_grad=False)
        self.scale_inv = nn.Parameter(scale_inv, requires_grad=False)

    @classmethod
    def empty(cls, shape: tuple[int, ...], device: torch.device | str = "meta") -> Fp8Weight:
        """An unfilled weight of `shape` (the loader builds on the meta device, then assigns)."""
        return cls(
            torch.empty(shape, dtype=FP8_DTYPE, device=device),
            torch.empty(scale_grid(shape), dtype=torch.float32, device=device),
        )

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    @property
    def device(self) -> torch.device:
        return self.q.device

    def data_ptr(self) -> int:
        """The e4m3 values' address: what `Stacked` compares to tell a stack is still whole."""
        return self.q.data_ptr()

    def __getitem__(self, i: int | slice) -> Fp8Weight:
        """Expert i (or a range) of a stack [E, N, K]: views of q and scale_inv."""
        if self.q.ndim < 3:
            raise IndexError("Fp8Weight: only a stack [E, N, K] is indexed")
        return Fp8Weight(self.q[i], self.scale_inv[i])

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """q * scale_inv per block, in float64 (exact: 4 significant bits times 24), cast
        once to dtype: models/fp8.py's dequantize_blocks, bit for bit."""
        s = self.scale_inv.to(torch.float64)
        s = s.repeat_interleave(BLOCK, dim=-2).repeat_interleave(BLOCK, dim=-1)
        s = s[..., : self.q.shape[-2], : self.q.shape[-1]]
        return (self.q.to(torch.float64) * s).to(dtype)

    def extra_repr(self) -> str:
        return f"shape={tuple(self.q.shape)}, block={BLOCK}x{BLOCK}"


def dense(w: torch.Tensor | Fp8Weight, dtype: torch.dtype) -> torch.Tensor:
    """A plain weight as it is; an Fp8Weight dequantized to dtype (the references' path)."""
    return w.dequantize(dtype) if isinstance(w, Fp8Weight) else w


def cat_rows(weights: list[Fp8Weight]) -> Fp8Weight | None:
    """FP8 weights [N_i, K] as one [sum N_i, K] weight (`Stacked` makes them views of it),
    or None where a block of scales would straddle two of them (an N_i before the last that
    is not a multiple of 128): those run alone."""
    if any(w.q.ndim != 2 for w in weights) or any(w.shape[0] % BLOCK for w in weights[:-1]):
        return None
    return Fp8Weight(
        torch.cat([w.q.detach() for w in weights]),
        torch.cat([w.scale_inv.detach() for w in weights]),
    )


def cat_stack(stack: Fp8Weight, one: Fp8Weight) -> Fp8Weight:
    """A stack [E, N, K] with one more expert [N, K] after it: [E+1, N, K]."""
    return Fp8Weight(
        torch.cat([stack.q.detach(), one.q.detach()[None]]),
        torch.cat([stack.scale_inv.detach(), one.scale_inv.detach()[None]]),
    )
