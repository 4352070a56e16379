"""Depthwise causal convolution with an explicit window of previous inputs (for rollback)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv(
    x: torch.Tensor,
    window: torch.Tensor,
    weight: torch.Tensor,
    dilation: int = 1,
    silu: bool = True,
    shift: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """y_t = act(sum_j w[:, j] * xfull[t + j * dilation]), xfull = cat(window, x).

    x: [B, T, C] new inputs; window: [B, (k-1)*dilation, C] the inputs before them (zeros at
    the start of a sequence); weight: [C, k]. Returns (y [B, T, C], xfull [B, W+T, C]): the
    caller keeps the last W rows of xfull up to the kept length, which is the rollback.
    shift: also write xfull's last W rows into `window`, in place (the window after all T
    rows: a step that keeps its one row, without a copy after it).
    """
    k = weight.shape[-1]
    t = x.shape[1]
    xfull = torch.cat([window.to(x.dtype), x], dim=1)
    y = xfull[:, 0:t] * weight[:, 0]
    for j in range(1, k):
        y = y + xfull[:, j * dilation : j * dilation + t] * weight[:, j]
    if shift:
        window.copy_(xfull[:, t:])
    return (F.silu(y) if silu else y), xfull


def conv_sessions(
    x: torch.Tensor,
    windows: list[torch.Tensor],
    weight: torch.Tensor,
    table: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """causal_conv (silu, no dilation) of B sessions' rows x [B, T, C], batch b after
    session b's window windows[b] [W, C], which then moves past the T rows in place (a lone
    step of several sessions). Here the windows are stacked, run together and copied back;
    `table` (session_tables.gdn_table) is for the in-place kernel and unused here."""
    y, xfull = causal_conv(x, torch.stack(windows), weight)
    torch._foreach_copy_(windows, list(xfull[:, x.shape[1] :]))
    return y, xfull
