"""A lone step's own row ops, as torch ops (`triton_rows.py` makes each one launch): the rows'
rotary inputs (a drafted step's window positions with them), the verdict into the host's
ring, the residual row kept for the MTP head."""

from __future__ import annotations

import torch

from flashlane.kernels.rowwise.reference import cos_sin


def step_angles(
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    dtype: torch.dtype,
    block: int,
    window: torch.Tensor | None = None,
    first: int = 0,
):
    """A lone step's rotary inputs at once: cos, sin of the rows' positions; cos, sin of
    their blocks' first positions (`block`); the rows' cache lengths positions + 1.

    window: [B*T] out for a drafted step's rows: row b*T + j is at positions[b] + first + j,
    written into `window` (a window's rows; an MTP chain's cell `first` drafts on, T = 1)."""
    if window is not None:
        t = window.numel() // positions.numel()
        offsets = torch.arange(first, first + t, dtype=positions.dtype, device=positions.device)
        positions = window.copy_((positions[:, None] + offsets).flatten())
    return (
        *cos_sin(positions, inv_freq, dtype),
        *cos_sin(positions, inv_freq, dtype, block),
        positions + 1,
    )


def post_ring(out: torch.Tensor, ring: torch.Tensor, k: torch.Tensor) -> None:
    """A lone step's verdict out [B, 2] into ring[(k - 1) % len(ring)] (k: steps recorded)."""
    ring[(int(k) - 1) % ring.shape[0]].copy_(out)


def record_row(
    rows: torch.Tensor,
    k: torch.Tensor,
    r: torch.Tensor,
    out: torch.Tensor | None = None,
    ring: torch.Tensor | None = None,
) -> None:
    """A lone step's residual rows r [B, W] kept for the MTP head, in place: rows[k] = r
    (rows [n, B, W], k [1]), k moves on by one; with out and ring, post_ring(out, ring, k)."""
    rows.index_copy_(0, k, r[None])
    k.add_(1)
    if ring is not None:
        post_ring(out, ring, k)
