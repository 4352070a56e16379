"""The keyed draw (DESIGN.md section 5) for the common rows of a batch in three or four launches.

Their host side is sampling/fused_draw.py (gpu.draw_rows_gpu calls it on CUDA, tests on the CPU
under TRITON_INTERPRET=1). They take rows with no logit_bias or penalties that are greedy, plain
or min_p (any T), top_k up to MAX_TOP_K (with or without top_p and min_p), or top_p without top_k
(with or without min_p); every other row (UNSETTLED in its OUT word), and any row they cannot
settle, comes back as None for the caller's torch path.
Launches, on [rows, chunks of BLOCK ids], all in one int64 workspace (triton_keyed):

1. `_stats_kernel`: each chunk's largest logit and its first id, whether it holds a NaN or +inf,
   and for top_k rows its K first candidates as int64 order keys (logit bits made monotone, then
   ~id: larger key = earlier in candidate order, ties to the lower id). The row's first k
   candidates are among the chunks' first K, so the rest of the row is never sorted.
2. `_score_kernel` (plain, min_p and top_p rows): z = l / T and the score
   z + gumbel(uniform(seed, position, id)) of every id passing min_p in float64, with the exact
   splitmix64 in uint64; a chunk whose best z plus the largest noise (< 37) stays below the first
   candidate's score, or whose best z fails min_p, needs no hash or log. Writes each chunk's best
   score and its lowest id (top_p rows: its TOP_P_SCORES best, see triton_top_p).
3. Only with top_p rows: triton_top_p's mass launch, S and the mass ahead of the row's best ids.
4. `_finish_kernel` (grid rows): greedy rows reduce launch 1, plain/min_p rows launch 2; top_k rows
   merge the chunks' keys (a bitonic top-K), apply top_k, top_p (S summed over the k kept) and
   min_p, and score the few survivors; top_p rows take their best kept id (triton_top_p). One
   int64 per row: the token, or a status below.

Each launch compiles in only the row kinds the call has (constexpr flags), so a call without
top_p rows runs the same code as before they were taken. The only host-to-device copy is the
parameter table (seed and position: the kernels hash the row key) and the only transfer back is
the int64s. z, exp and log are float64 and elementwise (CUDA's libdevice exp/log, as torch's CUDA
path), so a token differs from the CPU's only where DESIGN.md says a test need not look. Sums run
in another order than DESIGN's left to right, so a top_p cut is taken only when an error bound
proves it (gpu.py's bound); otherwise the row is returned as None and the caller's path settles it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from flashlane.kernels.sampling.triton_keyed import (
    BAD,
    BEST,
    BID,
    BIG_ID,
    IDX,
    KEY_PAD,
    KEYS,
    MAX,
    NOISE_BOUND,
    OUT,
    PLAIN,
    TOP_P,
    as_f64,
    as_words,
    best_of,
    gumbel,
    key_ids,
    order_key,
    param_f64,
    param_key,
    region,
    row_top,
    workspace_words,
)
from flashlane.kernels.sampling.triton_top_p import (
    TOP_P_SCORES,
    launch_mass,
    top_p_scores,
    top_p_token,
)

BLOCK = 4096  # ids per program in the launches on rows x chunks
WARPS = 8
# Statuses in the output (a token is >= 0).
NO_CANDIDATE, BAD_LOGIT, UNSETTLED = -1, -2, -3
DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # widen to fp32 exactly


@triton.jit
def _stats_kernel(
    logits_ptr, stride, V, ws_ptr, n, C, BLOCK: tl.constexpr, K: tl.constexpr, KP: tl.constexpr
):
    r = tl.program_id(0)
    c = tl.program_id(1)
    kind = tl.load(ws_ptr + r * 7)
    offs = c * BLOCK + tl.arange(0, BLOCK)
    valid = offs < V
    l = tl.load(logits_ptr + r * stride + offs, mask=valid, other=-float("inf")).to(tl.float32)
    bad = (l != l) | (l == float("inf"))
    lm = tl.where(bad, -float("inf"), l)
    m = tl.max(lm, 0)
    at = r * C + c
    tl.store(region(ws_ptr, n, C, MAX, KP) + at, as_words(m))
    idx = tl.min(tl.where(valid & (lm == m), offs, BIG_ID), 0)
    tl.store(region(ws_ptr, n, C, IDX, KP) + at, idx)
    tl.store(region(ws_ptr, n, C, BAD, KP) + at, tl.max(bad.to(tl.int32), 0))
    if kind == 3:
        keys = tl.where(valid, order_key(lm, offs), KEY_PAD)
        tl.store(region(ws_ptr, n, C, KEYS, KP) + at * K + tl.arange(0, K), tl.topk(keys, K))


@triton.jit
def _chunk_scores(
    logits_ptr, stride, V, ws_ptr, n, r, c, C, BLOCK: tl.constexpr, CP: tl.constexpr,
    KP: tl.constexpr,
):  # fmt: skip
    """z = l / T and the scores z + gumbel of chunk c's ids passing min_p (-inf elsewhere, and
    everywhere when no id of the chunk can beat the first candidate's score), and their ids."""
    top, i0, bad = row_top(ws_ptr, n, r, C, CP, KP)
    offs = c * BLOCK + tl.arange(0, BLOCK)
    s = tl.full([BLOCK], -float("inf"), tl.float64)
    if (bad == 0) & (top > -float("inf")):
        t = param_f64(ws_ptr, r, 1)
        min_p = param_f64(ws_ptr, r, 4)
        key = param_key(ws_ptr, r)
        zmax = top / t
        valid = offs < V
        l = tl.load(logits_ptr + r * stride + offs, mask=valid, other=-float("inf"))
        l = l.to(tl.float32)
        fin = l > -float("inf")
        z = tl.where(fin, l.to(tl.float64) / t, -float("inf"))
        zc = tl.max(z, 0)
        # The first candidate survives every filter: its score bounds the winner's.
        live = zc + NOISE_BOUND >= zmax + gumbel(key, i0)
        if min_p > 0.0:
            live = live & (tl.exp(zc - zmax) >= min_p)
        if live:
            keep = fin
            if min_p > 0.0:
                keep = keep & (tl.exp(z - zmax) >= min_p)
            s = tl.where(keep, z + gumbel(key, offs), -float("inf"))
    return s, offs


@triton.jit
def _score_kernel(
    logits_ptr, stride, V, ws_ptr, n, C, BLOCK: tl.constexpr, CP: tl.constexpr,
    KP: tl.constexpr, PLAIN_ROWS: tl.constexpr, TOP_P_ROWS: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0)
    c = tl.program_id(1)
    kind = tl.load(ws_ptr + r * 7)
    # Each kind compiled in only when the call has such rows (no registers spent otherwise).
    if PLAIN_ROWS:  # noqa: SIM102 (a constexpr gate: the branch is not compiled in without it)
        if kind == 2:
            s, offs = _chunk_scores(logits_ptr, stride, V, ws_ptr, n, r, c, C, BLOCK, CP, KP)
            best, bid = best_of(s, offs, s > -float("inf"))
            tl.store(region(ws_ptr, n, C, BEST, KP) + (r * C + c) * KP, as_words(best))
            tl.store(region(ws_ptr, n, C, BID, KP) + (r * C + c) * KP, bid)
    if TOP_P_ROWS:  # noqa: SIM102
        if kind == 4:
            s, offs = _chunk_scores(logits_ptr, stride, V, ws_ptr, n, r, c, C, BLOCK, CP, KP)
            top_p_scores(ws_ptr, n, r, c, C, s, offs, KP)


@triton.jit
def _top_k_draw(
    logits_ptr, stride, V, ws_ptr, n, r, C, top, CP: tl.constexpr, K: tl.constexpr,
    KP: tl.constexpr,
):  # fmt: skip
    """Steps 2-6 for a top_k row from the chunks' first K candidates; a token or UNSETTLED."""
    t = param_f64(ws_ptr, r, 1)
    top_k = tl.load(ws_ptr + r * 7 + 2)
    top_p = param_f64(ws_ptr, r, 3)
    min_p = param_f64(ws_ptr, r, 4)
    key = param_key(ws_ptr, r)
    zmax = top / t
    cc = tl.arange(0, CP)[:, None]
    kk = tl.arange(0, K)[None, :]
    keys_ptr = region(ws_ptr, n, C, KEYS, KP)
    keys = tl.load(keys_ptr + (r * C + cc) * K + kk, mask=cc < C, other=KEY_PAD)
    first = tl.topk(tl.reshape(keys, [CP * K]), K)  # the row's first K candidates, in order
    j = tl.arange(0, K)
    ids = key_ids(first)
    real = first > KEY_PAD
    l = tl.load(logits_ptr + r * stride + ids, mask=real, other=-float("inf")).to(tl.float32)
    fin = real & (l > -float("inf"))  # -inf ids sort last: the candidates are a prefix
    z = tl.where(fin, l.to(tl.float64) / t, -float("inf"))
    e = tl.exp(z - zmax)
    kept = fin & (j < top_k)
    settled = top_p >= 1.0
    if top_p < 1.0:
        em = tl.where(kept, e, 0.0)
        total = tl.sum(em, 0)
        running = tl.cumsum(em, 0)
        target = top_p * total
        num_kept = tl.sum(kept.to(tl.int32), 0)
        cut = tl.sum(((running < target) & kept).to(tl.int32), 0)  # first index reaching it
        at = tl.sum(tl.where(j == cut, running, 0.0), 0)
        before = tl.sum(tl.where(j == cut - 1, running, 0.0), 0)
        before = tl.where(cut > 0, before, -float("inf"))
        # Two orders of summing n nonnegative terms differ by at most 2 n 2**-53 of the total;
        # twice that, as S, the running sums and exp may each differ from the CPU's (gpu.py).
        slack = ((tl.zeros([], tl.float64) + V) * 4.0 + 16.0) * 1.1102230246251565e-16 * total
        proven = target - before > slack
        proven = proven & ((at - target > slack) | (cut >= num_kept))
        kept = kept & ((j <= cut) | (cut >= num_kept))
        settled = proven
    if min_p > 0.0:
        kept = kept & (e >= min_p)
    s = tl.where(kept, z + gumbel(key, ids), -float("inf"))
    best = tl.max(s, 0)
    token = tl.min(tl.where(kept & (s == best), ids, BIG_ID), 0).to(tl.int64)
    return tl.where(settled, token, -3)


@triton.jit
def _finish_kernel(
    logits_ptr, stride, V, ws_ptr, n, C, CP: tl.constexpr, K: tl.constexpr, KP: tl.constexpr,
    TOP_P_ROWS: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0)
    kind = tl.load(ws_ptr + r * 7)
    if kind != 0:
        top, i0, bad = row_top(ws_ptr, n, r, C, CP, KP)
        res = tl.full([], -1, tl.int64)
        if bad != 0:
            res = tl.full([], -2, tl.int64)
        elif top > -float("inf"):
            if kind == 1:
                res = i0.to(tl.int64)
            elif kind == 2:
                cc = tl.arange(0, CP)
                m = cc < C
                at = (r * C + cc) * KP
                pb = as_f64(tl.load(region(ws_ptr, n, C, BEST, KP) + at, mask=m, other=0))
                pi = tl.load(region(ws_ptr, n, C, BID, KP) + at, mask=m, other=BIG_ID)
                res = best_of(pb, pi, m)[1].to(tl.int64)
            elif kind == 3:
                res = _top_k_draw(logits_ptr, stride, V, ws_ptr, n, r, C, top, CP, K, KP)
            else:
                if TOP_P_ROWS:
                    res = top_p_token(ws_ptr, n, r, V, C, CP, KP)
        tl.store(region(ws_ptr, n, C, OUT, KP) + r, res)
    else:  # a row the kernels do not take (OTHER): the caller's host path draws it
        tl.store(region(ws_ptr, n, C, OUT, KP) + r, tl.full([], -3, tl.int64))


@dataclass(frozen=True, slots=True)
class Launches:
    """What the launches of a call are compiled for and how its workspace is laid out."""

    n: int  # rows
    vocab: int
    block: int  # ids per program, a power of two
    k: int  # candidates each chunk keeps for top_k rows (>= their largest top_k; 16 if none)
    has_top_k: bool  # the workspace holds KEYS (some row is a top_k row)
    plain_rows: bool  # the score launch runs for plain and min_p rows
    top_p_rows: bool  # the mass launch runs, and the finish takes top_p rows

    @staticmethod
    def of(
        n: int, vocab: int, kinds: Sequence[int], top_ks: Sequence[int], block: int = BLOCK
    ) -> Launches:
        """The launches for rows of these kinds; `top_ks` are the top_k rows' top_k."""
        max_k = max(top_ks, default=0)
        k = min(max(16, triton.next_power_of_2(max_k)), block) if max_k else 16
        return Launches(n, vocab, block, k, max_k > 0, PLAIN in kinds, TOP_P in kinds)

    @property
    def chunks(self) -> int:
        return triton.cdiv(self.vocab, self.block)

    @property
    def kp(self) -> int:
        return TOP_P_SCORES if self.top_p_rows else 1

    @property
    def words(self) -> int:
        """The workspace's size in int64 words (triton_keyed)."""
        return workspace_words(self.n, self.chunks, self.kp, self.k if self.has_top_k else 0)


def launch(logits: torch.Tensor, ws: torch.Tensor, shape: Launches) -> None:
    """The three or four launches over logits [n, V] (unit stride along V) and a workspace
    whose PARAMS hold the rows' table: each row's token or status lands in its OUT word. No
    host value is read and nothing is allocated, so a CUDA graph can hold them."""
    n, chunks, kp, k = shape.n, shape.chunks, shape.kp, shape.k
    cp = triton.next_power_of_2(chunks)
    rows = (logits, logits.stride(0), shape.vocab, ws, n, chunks)
    grid = (n, chunks)
    _stats_kernel[grid](*rows, shape.block, k, kp, num_warps=WARPS)
    if shape.plain_rows or shape.top_p_rows:
        _score_kernel[grid](
            *rows, shape.block, cp, kp, shape.plain_rows, shape.top_p_rows, num_warps=WARPS
        )
    if shape.top_p_rows:
        launch_mass(logits, ws, n, chunks, shape.block, kp, WARPS)
    _finish_kernel[(n,)](*rows, cp, k, kp, shape.top_p_rows, num_warps=WARPS)
