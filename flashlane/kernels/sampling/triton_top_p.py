"""top_p rows without top_k (DESIGN.md section 5, step 4) for triton_draw, without sorting.

The kept set is a prefix of the candidate order: id j is kept iff the mass before it,
M_j = sum of e_i = exp(z_i - zmax) over ids i ahead of j (z_i > z_j, or z_i == z_j and i < j),
is below top_p * S. The token is the best score among kept ids that pass min_p. So:

1. `top_p_scores` (inside the score launch): each chunk's KP best scores of ids passing min_p,
   best first. A chunk whose ids cannot beat the first candidate's score is skipped, as for
   plain rows: the first candidate i0 is always kept (M = 0), so the token scores at least as
   much as i0, and every such score is among the chunks' lists.
2. `_mass_kernel` (one more launch, rows x chunks): each program merges the row's KP best
   scores and sums, over its chunk, S and the mass before each of them.
3. `top_p_token` (inside the finish launch): walk the KP best scores in order (score
   descending, ties to the lower id); the first that is kept is the token. About top_p of the
   rows stop at the first.

Sums run in another order than DESIGN's left to right. Two orders of summing n nonnegative terms
differ by at most 2 n 2**-53 of the total, so M_j and top_p * S each lie within 2 V 2**-53 S of the
CPU's (gpu.py's bound); a decision closer than that, or a walk past KP scores, leaves the row
UNSETTLED for the caller's torch path.
"""

from __future__ import annotations

import triton
import triton.language as tl

from flashlane.kernels.sampling.triton_keyed import (
    BEST,
    BID,
    BIG_ID,
    MASS,
    as_f64,
    as_words,
    best_of,
    param_f64,
    region,
    row_top,
)

TOP_P_SCORES = 4  # KP: best scores kept per chunk and walked per row


@triton.jit
def top_p_scores(ws_ptr, n, r, c, C, s, offs, KP: tl.constexpr):
    """Stores chunk c's KP best scores of s [BLOCK] (-inf where not kept) and their ids."""
    best_ptr = region(ws_ptr, n, C, BEST, KP) + (r * C + c) * KP
    bid_ptr = region(ws_ptr, n, C, BID, KP) + (r * C + c) * KP
    for j in tl.static_range(KP):
        best, bid = best_of(s, offs, s > -float("inf"))
        tl.store(best_ptr + j, as_words(best))
        tl.store(bid_ptr + j, bid)
        s = tl.where(offs == bid, -float("inf"), s)


@triton.jit
def _row_scores(ws_ptr, n, r, C, CP: tl.constexpr, KP: tl.constexpr):
    """The row's KP best scores [KP], best first (ties to the lower id), and their ids."""
    cc = tl.arange(0, CP)[:, None]
    jj = tl.arange(0, KP)[None, :]
    at = (r * C + cc) * KP + jj
    m = (cc < C) & (jj >= 0)
    s = as_f64(tl.load(region(ws_ptr, n, C, BEST, KP) + at, mask=m, other=0))
    s = tl.reshape(tl.where(m, s, -float("inf")), [CP * KP])
    ids = tl.reshape(tl.load(region(ws_ptr, n, C, BID, KP) + at, mask=m, other=BIG_ID), [CP * KP])
    k = tl.arange(0, KP)
    row_s = tl.full([KP], -float("inf"), tl.float64)
    row_ids = tl.full([KP], BIG_ID, tl.int32)
    for j in tl.static_range(KP):
        best, bid = best_of(s, ids, s > -float("inf"))
        row_s = tl.where(k == j, best, row_s)
        row_ids = tl.where(k == j, bid, row_ids)
        s = tl.where(ids == bid, -float("inf"), s)
    return row_s, row_ids


@triton.jit
def _mass_kernel(
    logits_ptr, stride, V, ws_ptr, n, C, BLOCK: tl.constexpr, CP: tl.constexpr, KP: tl.constexpr
):
    r = tl.program_id(0)
    c = tl.program_id(1)
    if tl.load(ws_ptr + r * 7) == 4:  # a top_p row
        top, _i0, bad = row_top(ws_ptr, n, r, C, CP, KP)
        out = region(ws_ptr, n, C, MASS, KP) + (r * C + c) * (KP + 1)
        if (bad == 0) & (top > -float("inf")):
            t = param_f64(ws_ptr, r, 1)
            zmax = top / t
            _s, ids = _row_scores(ws_ptr, n, r, C, CP, KP)
            real = ids < BIG_ID
            lj = tl.load(logits_ptr + r * stride + ids, mask=real, other=0.0).to(tl.float32)
            zj = tl.where(real, lj.to(tl.float64) / t, float("inf"))  # none ahead of padding
            offs = c * BLOCK + tl.arange(0, BLOCK)
            l = tl.load(logits_ptr + r * stride + offs, mask=offs < V, other=-float("inf"))
            l = l.to(tl.float32)
            fin = l > -float("inf")
            z = tl.where(fin, l.to(tl.float64) / t, -float("inf"))
            e = tl.where(fin, tl.exp(z - zmax), 0.0)
            k = tl.arange(0, KP)
            for j in tl.static_range(KP):
                z_j = tl.sum(tl.where(k == j, zj, 0.0), 0)
                id_j = tl.sum(tl.where(k == j, ids, 0), 0)
                ahead = (z > z_j) | ((z == z_j) & (offs < id_j))
                tl.store(out + j, as_words(tl.sum(tl.where(ahead, e, 0.0), 0)))
            tl.store(out + KP, as_words(tl.sum(e, 0)))


def launch_mass(logits, ws, n: int, chunks: int, block: int, kp: int, warps: int) -> None:
    """Launch 2 above, for calls with top_p rows."""
    cp = triton.next_power_of_2(chunks)
    _mass_kernel[(n, chunks)](
        logits, logits.stride(0), logits.shape[1], ws, n, chunks, block, cp, kp, num_warps=warps
    )


@triton.jit
def top_p_token(ws_ptr, n, r, V, C, CP: tl.constexpr, KP: tl.constexpr):
    """Step 3 above: the token of top_p row r, or UNSETTLED (-3)."""
    top_p = param_f64(ws_ptr, r, 3)
    s, ids = _row_scores(ws_ptr, n, r, C, CP, KP)
    cc = tl.arange(0, CP)[:, None]
    kk = tl.arange(0, 2 * KP)  # the KP masses and S, padded to a power of two
    m = (cc < C) & (kk[None, :] <= KP)
    at = (r * C + cc) * (KP + 1) + kk[None, :]
    sums = tl.sum(as_f64(tl.load(region(ws_ptr, n, C, MASS, KP) + at, mask=m, other=0)), 0)
    total = tl.sum(tl.where(kk == KP, sums, 0.0), 0)
    k = tl.arange(0, KP)
    ahead = tl.sum(tl.where(k[:, None] == kk[None, :], sums[None, :], 0.0), 1)  # [KP]
    target = top_p * total
    # 2 V 2**-53 S for M_j and again for top_p * S, with room for exp's last bit (gpu.py).
    slack = ((tl.zeros([], tl.float64) + V) * 4.0 + 16.0) * 1.1102230246251565e-16 * total
    real = s > -float("inf")
    dropped = real & (ahead > target + slack)
    kept = real & (ahead < target - slack)
    first = tl.min(tl.where(dropped, KP, k), 0)  # the first score not proven dropped
    is_kept = tl.sum(tl.where((k == first) & kept, 1, 0), 0) > 0
    token = tl.sum(tl.where(k == first, ids, 0), 0)
    return tl.where(is_kept, token.to(tl.int64), -3)
