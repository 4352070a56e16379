"""Session tables in the Triton kernels: models.state's table layout as constexprs, and the
stand-in table of a launch that has none (its flag says it is unused). Needs triton."""

from __future__ import annotations

import functools

import torch
import triton.language as tl

from flashlane.models import state

TABLE_WIDTH = tl.constexpr(state.TABLE_WIDTH)
K_COL, V_COL, INDEX_COL, BLOCKS_COL, NB_COL = (
    tl.constexpr(state.TABLE_COLUMNS.index(c)) for c in state.TABLE_COLUMNS
)


@functools.cache
def no_table(device: torch.device) -> torch.Tensor:
    return torch.zeros(state.TABLE_WIDTH, dtype=torch.long, device=device)
