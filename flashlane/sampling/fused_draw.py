"""The host side of the fused keyed draw (its kernels: kernels/sampling/triton_draw.py): a
call's row kinds and parameter table go in, the rows' tokens come back as the sampler's results.

gpu.fused_kernels loads this module once, where Triton imports; lone_draw reaches the kernels'
Launches, launch, DTYPES and BLOCK through it too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from flashlane.kernels.sampling.triton_draw import (
    BAD_LOGIT,
    BLOCK,
    DTYPES,
    NO_CANDIDATE,
    UNSETTLED,
    Launches,
    launch,
)
from flashlane.kernels.sampling.triton_keyed import NPARAM
from flashlane.sampling.choose import DrawSpec, SampleError, no_candidate
from flashlane.sampling.kinds import OTHER, TOP_K, row_kind

__all__ = ["BLOCK", "DTYPES", "Launches", "draw_rows_fused", "launch", "param_table"]


def param_table(specs: Sequence[DrawSpec], kinds: list[int], vocab: int) -> torch.Tensor:
    """The kernels' parameter rows [n, NPARAM] int64 on the host (floats as their bits); the
    kernels hash seed and position into the row key themselves."""
    ints, floats = [], []
    for spec, kind in zip(specs, kinds):
        p = spec.params
        ints.append((kind, min(p.top_k, vocab), spec.seed, spec.position))
        floats.append((p.temperature, p.top_p, p.min_p))
    table = np.empty((len(specs), NPARAM), dtype=np.int64)
    table[:, [0, 2, 5, 6]] = ints
    table[:, [1, 3, 4]] = np.array(floats, dtype=np.float64).view(np.int64)
    return torch.from_numpy(table)


def draw_rows_fused(
    logits: torch.Tensor, specs: Sequence[DrawSpec], block: int = BLOCK
) -> list[int | SampleError | None]:
    """The draws of the rows the kernels take, None for the others (logits [N, V], fp32, bf16
    or fp16, on CUDA or, under TRITON_INTERPRET=1, the CPU). `block`: ids per program, a power
    of two (tests shrink it to cover many chunks)."""
    n, vocab = logits.shape
    kinds = [row_kind(s.params, vocab) for s in specs]
    if logits.dtype not in DTYPES or not any(kinds):
        return [None] * n
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    top_ks = [s.params.top_k for s, k in zip(specs, kinds) if k == TOP_K]
    shape = Launches.of(n, vocab, kinds, top_ks, block)
    # The one allocation: every launch's scratch, the parameters and the output (triton_keyed).
    ws = torch.empty(shape.words, dtype=torch.int64, device=logits.device)
    ws[: n * NPARAM].copy_(param_table(specs, kinds, vocab).view(-1))
    launch(logits, ws, shape)
    out = ws[n * NPARAM : n * (NPARAM + 1)].tolist()  # the one transfer
    results: list[int | SampleError | None] = []
    for kind, v in zip(kinds, out):
        if kind == OTHER or v in (BAD_LOGIT, UNSETTLED):
            results.append(None)  # the caller's path names the bad id, or settles the cut
        else:
            results.append(no_candidate(-math.inf) if v == NO_CANDIDATE else v)
    return results
