"""Session tables in the Triton kernels: session_tables' layout as constexprs, and the
stand-in table of a launch that has none (its flag says it is unused). Needs triton."""

from __future__ import annotations

import functools

import torch
import triton.language as tl

from flashlane.kernels import session_tables as layout

TABLE_WIDTH = tl.constexpr(layout.TABLE_WIDTH)
K_COL, V_COL, INDEX_COL, BLOCKS_COL, NB_COL, KS_COL, VS_COL, IS_COL = (
    tl.constexpr(layout.TABLE_COLUMNS.index(c)) for c in layout.TABLE_COLUMNS
)


@functools.cache
def no_table(device: torch.device) -> torch.Tensor:
    return torch.zeros(layout.TABLE_WIDTH, dtype=torch.long, device=device)


@functools.cache
def no_longs(device: torch.device) -> torch.Tensor:
    """A stand-in int64 pointer (lengths, positions) whose flag says it is unused: one
    pointer type keeps one compiled kernel."""
    return torch.zeros(1, dtype=torch.long, device=device)


@functools.cache
def no_scales(device: torch.device) -> torch.Tensor:
    """The stand-in fp32 scales pointer of a cache that is not 8-bit (FP8 says unused)."""
    return torch.zeros(1, dtype=torch.float32, device=device)
