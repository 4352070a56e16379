"""Norms: zero-centred RMSNorm (optionally per group) and the GDN gated norm."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    group: int | None = None,
    rows: torch.Tensor | None = None,
    keep: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Zero-centred RMSNorm `x * rsqrt(mean(x^2) + eps) * (1 + w)` over the last dim.

    x: [..., D]; weight: [D]. With `group`, each run of `group` values is normalised alone
    (the hyper-connection norms normalise each of the hc streams of a [.., hc*H] residual).
    rows: [M] indices into x [N, D]: the norm of x[rows]. keep: (picks [B], out [B, D]):
    also out[b] = x[picks[b]], each pick in its own run of N / B rows (a drafted step's last
    kept rows). Computes in at least fp32 and returns x's dtype.
    """
    if keep is not None:
        torch.index_select(x, 0, keep[0], out=keep[1])
    x = x if rows is None else x[rows]
    dtype = x.dtype
    h = x.to(torch.promote_types(dtype, torch.float32))
    if group is not None:
        h = h.unflatten(-1, (-1, group))
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if group is not None:
        h = h.flatten(-2)
    return (h * (1.0 + weight.to(h.dtype))).to(dtype)


def gated_rms_norm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float, activation: str
) -> torch.Tensor:
    """The GDN output norm: plain RMSNorm (weight `w`, not `1 + w`) times act(gate).

    x, gate: [..., Dv]; weight: [Dv]; activation "sigmoid" | "silu".
    """
    dtype = x.dtype
    h = x.to(torch.promote_types(dtype, torch.float32))
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    h = weight * h.to(dtype)
    g = gate.to(h.dtype if h.dtype == torch.float64 else torch.float32)
    act = torch.sigmoid(g) if activation == "sigmoid" else F.silu(g)
    return (h * act).to(dtype)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x * rsqrt(sum(x^2) + eps) over the last dim (fla's convention for GDN q and k)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def row_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim: [..., D] -> [...]."""
    return x.sum(-1)
