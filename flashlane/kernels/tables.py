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
