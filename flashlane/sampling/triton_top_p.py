"""top_p rows without top_k (DESIGN.md section 5, step 4) for triton_draw, without sorting.

The kept set is the shortest prefix of the candidate order whose running sum of e = exp(z - zmax)
reaches top_p * S. Ids are binned by x = zmax - z (float64, exactly as every kernel computes it):
bins follow the candidate order, so "bin < b" is a prefix of it. On [rows, chunks]:

1. `_coarse_kernel` (launch 2): each chunk's mass per 1-nat bin of x (fp32, only a guess).
2. `_fine_kernel` (launch 3): every program picks the same band, the 1-nat bin where the guessed
   running mass crosses top_p * S, and sums exact float64 masses: the chunk's S, its mass before
   the band, and its mass in each 1/64-nat sub-bin of the band.
3. `top_p_score` (inside triton_draw's score launch): from those sums the edge bin, the fine bin
   where the running sum crosses top_p * S. Ids before it are kept, ids after it are dropped;
   the chunk's best kept score, its best score in the edge bin, and the edge bin's order keys.
4. `top_p_draw` (inside the finish launch): the cut is taken only when an error bound proves the
   running sum crosses top_p * S inside the edge bin (as gpu.py's bound; sums run in another order
   than DESIGN's). If no id of the edge bin beats the best kept score, the token is that score's;
   otherwise the edge bin's ids are checked in score order, each kept or dropped by the exact
   running sum before it (one masked sum over the gathered keys). Anything not proven is
   UNSETTLED and the caller's torch path draws the row.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from flashlane.sampling.triton_keyed import (
    BIG_ID,
    KEY_PAD,
    NOISE_BOUND,
    gumbel,
    key_ids,
    order_key,
    param_f64,
    param_key,
    row_best,
    row_top,
)

COARSE_BINS = 32  # 1 nat each below zmax; the last holds every id 31 or more nats down
FINE_BINS = 64  # sub-bins of the band, 1/64 nat (a power of two: x * 64 is exact)
EDGE_CAP = 32  # edge-bin keys kept per chunk; a row with more takes the torch path if needed
COARSE_TILE, FINE_TILE = 256, 32  # ids per step of the one-hot histograms
SCORE_TILE = 1024  # ids per step of top_p_score
ITER = 12  # edge-bin ids tried in score order before giving the row up
NROW = 8  # per-row scalars: band, edge, before, at, target, total
TOP_P_KIND = tl.constexpr(4)


class TopPBuffers(NamedTuple):
    coarse: torch.Tensor  # [n, chunks, COARSE_BINS] fp32 guessed mass per 1-nat bin
    fine: torch.Tensor  # [n, chunks, FINE_BINS + 2] fp64: band sub-bins, before band, chunk S
    row: torch.Tensor  # [n, NROW] fp64, see NROW
    edge: torch.Tensor  # [n, chunks, 3] fp64: best edge-bin score, its id, edge-bin count
    keys: torch.Tensor  # [n, chunks, EDGE_CAP] int64 order keys of the edge bin


def top_p_buffers(n: int, chunks: int, device: torch.device, used: bool) -> TopPBuffers:
    if not used:
        f32, f64 = torch.empty(1, device=device), torch.empty(1, dtype=torch.float64, device=device)
        return TopPBuffers(f32, f64, f64, f64, torch.empty(1, dtype=torch.int64, device=device))
    return TopPBuffers(
        torch.empty((n, chunks, COARSE_BINS), dtype=torch.float32, device=device),
        torch.empty((n, chunks, FINE_BINS + 2), dtype=torch.float64, device=device),
        torch.empty((n, NROW), dtype=torch.float64, device=device),
        torch.empty((n, chunks, 3), dtype=torch.float64, device=device),
        torch.empty((n, chunks, EDGE_CAP), dtype=torch.int64, device=device),
    )


def launch_top_p_passes(rows: tuple, bufs: TopPBuffers, chunks: int, block: int, warps: int):
    """Launches 2 and 3; `rows` = (logits, stride, V, params, pmax, pidx, pbad)."""
    grid = (rows[0].shape[0], chunks)
    cp = triton.next_power_of_2(chunks)
    _coarse_kernel[grid](
        *rows, bufs.coarse, chunks, block, cp, COARSE_TILE, COARSE_BINS, num_warps=warps
    )
    _fine_kernel[grid](
        *rows, bufs.coarse, bufs.fine, bufs.row, chunks, block, cp, FINE_TILE, COARSE_BINS,
        FINE_BINS, NROW, num_warps=warps,
    )  # fmt: skip


@triton.jit
def _chunk_x(logits_ptr, stride, V, r, offs, t, zmax):
    """The logits at offs, whether each is a candidate, z = l / T and x = zmax - z (+inf off)."""
    l = tl.load(logits_ptr + r * stride + offs, mask=offs < V, other=-float("inf"))
    l = l.to(tl.float32)
    fin = l > -float("inf")
    z = tl.where(fin, l.to(tl.float64) / t, -float("inf"))
    return l, fin, z, zmax - z


@triton.jit
def _coarse_kernel(
    logits_ptr, stride, V, params_ptr, pmax_ptr, pidx_ptr, pbad_ptr, pcoarse_ptr, C,
    BLOCK: tl.constexpr, CP: tl.constexpr, TILE: tl.constexpr, NB: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0)
    c = tl.program_id(1)
    if tl.load(params_ptr + r * 6) == TOP_P_KIND:
        top, _i0, bad = row_top(pmax_ptr, pidx_ptr, pbad_ptr, r, C, CP)
        acc = tl.zeros([TILE, NB], tl.float32)
        if (bad == 0) & (top > -float("inf")):
            t = param_f64(params_ptr, r, 1)
            zmax = top.to(tl.float64) / t
            bins = tl.arange(0, NB)[None, :]
            for s in range(0, BLOCK, TILE):
                offs = c * BLOCK + s + tl.arange(0, TILE)
                _l, _fin, z, x = _chunk_x(logits_ptr, stride, V, r, offs, t, zmax)
                e = tl.exp((z - zmax).to(tl.float32))
                b = tl.minimum(x, NB - 1.0).to(tl.int32)
                acc += tl.where(b[:, None] == bins, e[:, None], 0.0)
        tl.store(pcoarse_ptr + (r * C + c) * NB + tl.arange(0, NB), tl.sum(acc, 0))


@triton.jit
def _band(pcoarse_ptr, r, C, top_p, CP: tl.constexpr, NB: tl.constexpr):
    """The 1-nat bin where the guessed running mass crosses top_p * S (float64)."""
    cc = tl.arange(0, CP)[:, None]
    h = tl.load(pcoarse_ptr + (r * C + cc) * NB + tl.arange(0, NB)[None, :], mask=cc < C, other=0.0)
    mass = tl.sum(h, 0)
    target = top_p.to(tl.float32) * tl.sum(mass, 0)
    band = tl.sum((tl.cumsum(mass, 0) < target).to(tl.int32), 0)
    return tl.minimum(band, NB - 1).to(tl.float64)


@triton.jit
def _fine_kernel(
    logits_ptr, stride, V, params_ptr, pmax_ptr, pidx_ptr, pbad_ptr, pcoarse_ptr, pfine_ptr,
    prow_ptr, C, BLOCK: tl.constexpr, CP: tl.constexpr, TILE: tl.constexpr, NB: tl.constexpr,
    NF: tl.constexpr, NR: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0)
    c = tl.program_id(1)
    if tl.load(params_ptr + r * 6) == TOP_P_KIND:
        top, _i0, bad = row_top(pmax_ptr, pidx_ptr, pbad_ptr, r, C, CP)
        acc = tl.zeros([TILE, NF], tl.float64)
        below = tl.zeros([TILE], tl.float64)
        total = tl.zeros([TILE], tl.float64)
        if (bad == 0) & (top > -float("inf")):
            t = param_f64(params_ptr, r, 1)
            band = _band(pcoarse_ptr, r, C, param_f64(params_ptr, r, 3), CP, NB)
            if c == 0:
                tl.store(prow_ptr + r * NR, band)
            zmax = top.to(tl.float64) / t
            subs = tl.arange(0, NF)[None, :]
            for s in range(0, BLOCK, TILE):
                offs = c * BLOCK + s + tl.arange(0, TILE)
                _l, _fin, z, x = _chunk_x(logits_ptr, stride, V, r, offs, t, zmax)
                e = tl.exp(z - zmax)
                total += e
                nat = tl.floor(x)
                below += tl.where(nat < band, e, 0.0)
                in_band = nat == band
                if tl.max(in_band.to(tl.int32), 0) > 0:
                    k = tl.where(in_band, tl.floor(x * NF) - band * NF, -1.0).to(tl.int32)
                    acc += tl.where(k[:, None] == subs, e[:, None], 0.0)
        out = pfine_ptr + (r * C + c) * (NF + 2)
        tl.store(out + tl.arange(0, NF), tl.sum(acc, 0))
        tl.store(out + NF, tl.sum(below, 0))
        tl.store(out + NF + 1, tl.sum(total, 0))


@triton.jit
def _edge(pfine_ptr, r, C, top_p, CP: tl.constexpr, NF: tl.constexpr):
    """The sub-bin of the band where the running sum crosses top_p * S (NF if none), the sums
    before and through it, top_p * S and S."""
    cc = tl.arange(0, CP)[:, None]
    kk = tl.arange(0, NF)
    rows = pfine_ptr + (r * C + cc) * (NF + 2)
    mass = tl.sum(tl.load(rows + kk[None, :], mask=cc < C, other=0.0), 0)
    below = tl.sum(tl.sum(tl.load(rows + NF, mask=cc < C, other=0.0), 1), 0)
    total = tl.sum(tl.sum(tl.load(rows + NF + 1, mask=cc < C, other=0.0), 1), 0)
    target = top_p * total
    cum = below + tl.cumsum(mass, 0)
    cut = tl.sum((cum < target).to(tl.int32), 0)
    at = tl.sum(tl.where(kk == cut, cum, 0.0), 0)
    before = tl.where(cut > 0, tl.sum(tl.where(kk == cut - 1, cum, 0.0), 0), below)
    return cut, before, at, target, total


@triton.jit
def _running_best(best, bid, s, ids):
    """(best, bid) after a tile's scores s (-inf where not scored); tiles come in ascending
    ids, so ties keep the lower id."""
    tile_best = tl.max(s, 0)
    tile_id = tl.min(tl.where(s == tile_best, ids, BIG_ID), 0)
    better = tile_best > best
    return tl.where(better, tile_best, best), tl.where(better, tile_id, bid)


@triton.jit
def top_p_score(
    logits_ptr, stride, V, params_ptr, pmax_ptr, pidx_ptr, pbad_ptr, pbest_ptr, pbid_ptr,
    pfine_ptr, prow_ptr, pedge_ptr, pkeys_ptr, r, c, C, BLOCK: tl.constexpr, CP: tl.constexpr,
    NF: tl.constexpr, NR: tl.constexpr, CAP: tl.constexpr, TILE: tl.constexpr,
):  # fmt: skip
    """Step 3 above for chunk c of top_p row r, TILE ids at a time."""
    top, i0, bad = row_top(pmax_ptr, pidx_ptr, pbad_ptr, r, C, CP)
    best = tl.full([], -float("inf"), tl.float64)
    bid = tl.full([], BIG_ID, tl.int32)
    ebest = tl.full([], -float("inf"), tl.float64)
    ebid = tl.full([], BIG_ID, tl.int32)
    count = tl.full([], 0, tl.int32)
    if (bad == 0) & (top > -float("inf")):
        t = param_f64(params_ptr, r, 1)
        top_p = param_f64(params_ptr, r, 3)
        min_p = param_f64(params_ptr, r, 4)
        key = param_key(params_ptr, r)
        zmax = top.to(tl.float64) / t
        band = tl.load(prow_ptr + r * NR)
        cut, before, at, target, total = _edge(pfine_ptr, r, C, top_p, CP, NF)
        edge = band * NF + cut  # the edge bin, in 1/NF nats from zmax
        if c == 0:
            tl.store(prow_ptr + r * NR + 1, edge)
            tl.store(prow_ptr + r * NR + 2, before)
            tl.store(prow_ptr + r * NR + 3, at)
            tl.store(prow_ptr + r * NR + 4, target)
            tl.store(prow_ptr + r * NR + 5, total)
        # The first candidate is kept and passes min_p: its score bounds the winner's.
        b0 = zmax + gumbel(key, i0)
        for s0 in range(0, BLOCK, TILE):
            offs = c * BLOCK + s0 + tl.arange(0, TILE)
            l, fin, z, x = _chunk_x(logits_ptr, stride, V, r, offs, t, zmax)
            fine = tl.floor(x * NF)
            kept = fin & (fine < edge)
            at_edge = fin & (fine == edge)
            pos = count + tl.cumsum(at_edge.to(tl.int32), 0) - 1
            count += tl.sum(at_edge.to(tl.int32), 0)
            out = pkeys_ptr + (r * C + c) * CAP + pos
            tl.store(out, order_key(l, offs), mask=at_edge & (pos < CAP))
            if min_p > 0.0:
                passes = tl.exp(z - zmax) >= min_p
                kept = kept & passes
                at_edge = at_edge & passes
            if tl.max(tl.where(kept | at_edge, z, -float("inf")), 0) + NOISE_BOUND >= b0:
                s = z + gumbel(key, offs)
                best, bid = _running_best(best, bid, tl.where(kept, s, -float("inf")), offs)
                ebest, ebid = _running_best(ebest, ebid, tl.where(at_edge, s, -float("inf")), offs)
    tl.store(pbest_ptr + r * C + c, best)
    tl.store(pbid_ptr + r * C + c, bid)
    tl.store(pedge_ptr + (r * C + c) * 3, ebest)
    tl.store(pedge_ptr + (r * C + c) * 3 + 1, ebid.to(tl.float64))
    tl.store(pedge_ptr + (r * C + c) * 3 + 2, count.to(tl.float64))


@triton.jit
def top_p_draw(
    logits_ptr, stride, V, params_ptr, pbest_ptr, pbid_ptr, prow_ptr, pedge_ptr, pkeys_ptr, r,
    C, top, CP: tl.constexpr, NR: tl.constexpr, CAP: tl.constexpr, ITER: tl.constexpr,
):  # fmt: skip
    """Step 4 above: the token of top_p row r, or UNSETTLED (-3)."""
    before = tl.load(prow_ptr + r * NR + 2)
    at = tl.load(prow_ptr + r * NR + 3)
    target = tl.load(prow_ptr + r * NR + 4)
    total = tl.load(prow_ptr + r * NR + 5)
    # Two orders of summing n nonnegative terms differ by at most 2 n 2**-53 of the total;
    # twice that, as S, the running sums and exp may each differ from the CPU's (gpu.py).
    slack = ((tl.zeros([], tl.float64) + V) * 4.0 + 16.0) * 1.1102230246251565e-16 * total
    proven = (target - before > slack) & (at - target > slack)
    best, bid = row_best(pbest_ptr, pbid_ptr, r, C, CP)
    cc = tl.arange(0, CP)
    eb = tl.load(pedge_ptr + (r * C + cc) * 3, mask=cc < C, other=-float("inf"))
    ebest = tl.max(eb, 0)
    eid = tl.load(pedge_ptr + (r * C + cc) * 3 + 1, mask=cc < C, other=BIG_ID).to(tl.int32)
    ebid = tl.min(tl.where((cc < C) & (eb == ebest), eid, BIG_ID), 0)
    beats = (ebest > -float("inf")) & ((ebest > best) | ((ebest == best) & (ebid < bid)))
    token = bid
    settled = proven.to(tl.int32)
    if proven & beats:
        token, settled = _edge_draw(
            logits_ptr, stride, params_ptr, pedge_ptr, pkeys_ptr, r, C, top, before, target,
            slack, best, bid, CP, CAP, ITER,
        )  # fmt: skip
    return tl.where((settled != 0) & (token < BIG_ID), token.to(tl.int64), -3)


@triton.jit
def _edge_draw(
    logits_ptr, stride, params_ptr, pedge_ptr, pkeys_ptr, r, C, top, before, target, slack,
    best, bid, CP: tl.constexpr, CAP: tl.constexpr, ITER: tl.constexpr,
):  # fmt: skip
    """An edge-bin id beats the best kept score: try the edge bin's ids in score order. One is
    kept if the running sum before it stays below top_p * S; a dropped one drops every id after
    it. Returns (token, settled as 0/1)."""
    t = param_f64(params_ptr, r, 1)
    min_p = param_f64(params_ptr, r, 4)
    key = param_key(params_ptr, r)
    zmax = top.to(tl.float64) / t
    cc = tl.arange(0, CP)
    counts = tl.load(pedge_ptr + (r * C + cc) * 3 + 2, mask=cc < C, other=0.0).to(tl.int32)
    jj = tl.arange(0, CAP)[None, :]
    m = (cc[:, None] < C) & (jj < counts[:, None])
    keys = tl.load(pkeys_ptr + (r * C + cc[:, None]) * CAP + jj, mask=m, other=KEY_PAD)
    keys = tl.reshape(keys, [CP * CAP])
    m = tl.reshape(m, [CP * CAP])
    ids = key_ids(keys)
    l = tl.load(logits_ptr + r * stride + ids, mask=m, other=-float("inf")).to(tl.float32)
    z = l.to(tl.float64) / t
    e = tl.where(m, tl.exp(z - zmax), 0.0)
    live = m
    if min_p > 0.0:
        live = live & (e >= min_p)
    s = tl.where(live, z + gumbel(key, ids), -float("inf"))
    token = bid
    done = tl.full([], 0, tl.int32)
    settled = (tl.max(counts, 0) <= CAP).to(tl.int32)
    for _ in range(ITER):
        top_s = tl.max(s, 0)
        mid = tl.min(tl.where(live & (s == top_s), ids, BIG_ID), 0)
        mkey = tl.max(tl.where(live & (ids == mid), keys, KEY_PAD), 0)
        better = (top_s > -float("inf")) & ((top_s > best) | ((top_s == best) & (mid < bid)))
        run = before + tl.sum(tl.where(keys > mkey, e, 0.0), 0)
        open_ = done == 0
        take_kept = open_ & (better == 0)
        take_edge = open_ & better & (run < target - slack)
        unsure = open_ & better & (run <= target + slack) & (run >= target - slack)
        token = tl.where(take_edge, mid, tl.where(take_kept, bid, token))
        settled = tl.where(unsure, 0, settled)
        done = tl.where(take_kept | take_edge | unsure, 1, done)
        s = tl.where(keys <= mkey, -float("inf"), s)  # mkey and every id after it: dropped
    return token, settled * done
