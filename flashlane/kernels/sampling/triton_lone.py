"""The landing of a lone step's keyed draw (lone_draw.KeyedDraw) in one launch on rows.

After triton_draw's launches each row's OUT word holds its token or a status. `land` writes,
as kernels.greedy_step does for greedy steps, out[:, 0] the token, out[:, 1] 1 for a token,
tok the token and pos + 1. A row without a token gets flag 0, tok 0 (a safe id: the step in
flight feeds it, and the reply has ended) and in out[:, 0] lone_draw's failure code; for a
NaN or +inf logit the program scans its row for the first such id (shared rounds name it),
which costs nothing on rows that have a token.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.sampling.triton_keyed import BIG_ID, OUT, region

SCAN = 1024  # ids a failed row's program reads at a time


@triton.jit
def _land_kernel(
    ws_ptr,
    n,
    C,
    logits_ptr,
    stride,
    V,
    out_ptr,
    stride_out,
    tok_ptr,
    pos_ptr,
    KP: tl.constexpr,
    SCAN: tl.constexpr,
):
    r = tl.program_id(0)
    res = tl.load(region(ws_ptr, n, C, OUT, KP) + r)
    code = res
    if res == -2:  # BAD_LOGIT: the first NaN, else the first +inf
        nan_at = tl.full([], BIG_ID, tl.int64)
        inf_at = tl.full([], BIG_ID, tl.int64)
        for c in range(0, tl.cdiv(V, SCAN)):
            offs = c * SCAN + tl.arange(0, SCAN)
            l = tl.load(logits_ptr + r * stride + offs, mask=offs < V, other=0.0).to(tl.float32)
            nan_at = tl.minimum(nan_at, tl.min(tl.where(l != l, offs, BIG_ID), 0).to(tl.int64))
            inf_at = tl.minimum(
                inf_at, tl.min(tl.where(l == float("inf"), offs, BIG_ID), 0).to(tl.int64)
            )
        code = tl.where(nan_at < BIG_ID, -4 - 2 * nan_at, -5 - 2 * inf_at)
    ok = res >= 0
    tl.store(out_ptr + r * stride_out, tl.where(ok, res, code))
    tl.store(out_ptr + r * stride_out + 1, ok.to(tl.int64))
    tl.store(tok_ptr + r, tl.where(ok, res, 0))
    tl.store(pos_ptr + r, tl.load(pos_ptr + r) + 1)


def land(
    ws: torch.Tensor,
    n: int,
    chunks: int,
    kp: int,
    logits: torch.Tensor,
    out: torch.Tensor,
    tok: torch.Tensor,
    pos: torch.Tensor,
) -> None:
    """out [n, 2+], tok [n], pos [n] (int64, contiguous rows) from the workspace's OUT words
    (triton_keyed's layout for n rows, `chunks` chunks, `kp` scores) and logits [n, V]."""
    _land_kernel[(n,)](
        ws,
        n,
        chunks,
        logits,
        logits.stride(0),
        logits.shape[1],
        out,
        out.stride(0),
        tok,
        pos,
        kp,
        SCAN,
        num_warps=4,
    )
