"""The keyed draw (DESIGN.md section 5) for the common rows of a batch in three Triton launches.

gpu.draw_rows_gpu calls this on CUDA (tests call it on the CPU under TRITON_INTERPRET=1). It takes
rows with no logit_bias or penalties that are greedy, plain or min_p (any T), or top_k up to
MAX_TOP_K (with or without top_p and min_p); every other row, and any row it cannot settle, comes
back as None for the caller's torch path. Launches, on [rows, chunks of BLOCK ids]:

1. `_stats_kernel` (grid rows x chunks): each chunk's largest logit and its first id, whether it
   holds a NaN or +inf, and for top_k rows its K first candidates as int64 order keys (logit bits
   made monotone, then ~id: larger key = earlier in candidate order, ties to the lower id). The
   row's first k candidates are among the chunks' first K, so the rest of the row is never sorted.
2. `_score_kernel` (grid rows x chunks; plain and min_p rows): z = l / T and the score
   z + gumbel(uniform(seed, position, id)) of every kept id in float64, with the exact splitmix64
   in uint64; a chunk whose best z plus the largest noise (< 37) stays below the first
   candidate's score, or whose best z fails min_p, needs no hash or log. Writes each chunk's best
   score and its lowest id.
3. `_finish_kernel` (grid rows): greedy rows reduce launch 1, plain/min_p rows launch 2; top_k rows
   merge the chunks' keys (a bitonic top-K), apply top_k, top_p (S summed over the k kept) and
   min_p, and score the few survivors. One int64 per row: the token, or a status below.

The only device-to-host transfer is those int64s. z, exp and log are float64 and elementwise
(CUDA's libdevice exp/log, as torch's CUDA path), so a token differs from the CPU's only where
DESIGN.md says a test need not look. Sums run in another order than DESIGN's left to right, so a
top_p cut is taken only when an error bound proves it (gpu.py's bound); otherwise the row is
returned as None and the caller's path settles it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import triton
import triton.language as tl

from flashlane.sampling.choose import GREEDY_TEMPERATURE, DrawSpec, SampleError, no_candidate
from flashlane.sampling.keyed import row_key

BLOCK = 4096  # ids per program in launches 1 and 2
MAX_TOP_K = 128  # larger top_k rows take the torch path
WARPS = 8
# Row kinds in the parameter table.
OTHER, GREEDY, PLAIN, TOP_K = 0, 1, 2, 3
# Statuses in the output (a token is >= 0).
NO_CANDIDATE, BAD_LOGIT, UNSETTLED = -1, -2, -3
NPARAM = 6  # kind, T, top_k, top_p, min_p, row key (floats as their int64 bits)
BIG_ID = tl.constexpr(2147483647)
KEY_PAD = tl.constexpr(-9223372036854775807)  # below every order key
LOW32 = tl.constexpr(4294967295)
NOISE_BOUND = tl.constexpr(37.0)  # above any noise the hash gives (36.74); exact in fp32 too
DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # widen to fp32 exactly


@triton.jit
def _splitmix64(x):
    """DESIGN.md's splitmix64 on uint64 (wrapping add and multiply, logical shifts)."""
    x = x + 0x9E3779B97F4A7C15
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB
    return x ^ (x >> 31)


@triton.jit
def _gumbel(key, ids):
    """gumbel(uniform(seed, position, id)) in float64 for int ids, key = row_key (uint64)."""
    h = _splitmix64(key ^ ids.to(tl.int64).to(tl.uint64, bitcast=True))
    u = ((h >> 12).to(tl.float64) + 0.5) * 2.220446049250313e-16  # 2**-52, exact
    return -tl.log(-tl.log(u))


@triton.jit
def _order_key(l, ids):
    """int64 keys that sort like the candidate order, descending: the fp32 logit's bits made
    monotone (-0.0 as +0.0, so they tie) above 2**32 - 1 - id (ties to the lower id)."""
    l = tl.where(l == 0.0, 0.0, l)
    b = l.to(tl.int32, bitcast=True)
    b = tl.where(b < 0, b ^ 0x7FFFFFFF, b)
    return (b.to(tl.int64) << 32) | (ids.to(tl.int64) ^ LOW32)  # ^: 2**32 - 1 - id


@triton.jit
def _param_f64(params_ptr, r, col: tl.constexpr):
    return tl.load(params_ptr + r * 6 + col).to(tl.float64, bitcast=True)


@triton.jit
def _row_top(pmax_ptr, pidx_ptr, pbad_ptr, r, C, CP: tl.constexpr):
    """The row's largest logit, its first id, and whether any chunk saw a NaN or +inf."""
    cc = tl.arange(0, CP)
    m = cc < C
    pm = tl.load(pmax_ptr + r * C + cc, mask=m, other=-float("inf"))
    top = tl.max(pm, 0)
    pi = tl.load(pidx_ptr + r * C + cc, mask=m, other=BIG_ID)
    i0 = tl.min(tl.where(m & (pm == top), pi, BIG_ID), 0)
    bad = tl.max(tl.load(pbad_ptr + r * C + cc, mask=m, other=0), 0)
    return top, i0, bad


@triton.jit
def _stats_kernel(
    logits_ptr,
    stride,
    V,
    params_ptr,
    pmax_ptr,
    pidx_ptr,
    pbad_ptr,
    ptop_ptr,
    C,
    BLOCK: tl.constexpr,
    K: tl.constexpr,
):
    r = tl.program_id(0)
    c = tl.program_id(1)
    kind = tl.load(params_ptr + r * 6)
    offs = c * BLOCK + tl.arange(0, BLOCK)
    valid = offs < V
    l = tl.load(logits_ptr + r * stride + offs, mask=valid, other=-float("inf")).to(tl.float32)
    bad = (l != l) | (l == float("inf"))
    lm = tl.where(bad, -float("inf"), l)
    m = tl.max(lm, 0)
    tl.store(pmax_ptr + r * C + c, m)
    tl.store(pidx_ptr + r * C + c, tl.min(tl.where(valid & (lm == m), offs, BIG_ID), 0))
    tl.store(pbad_ptr + r * C + c, tl.max(bad.to(tl.int32), 0))
    if kind == 3:
        keys = tl.where(valid, _order_key(lm, offs), KEY_PAD)
        tl.store(ptop_ptr + (r * C + c) * K + tl.arange(0, K), tl.topk(keys, K))


@triton.jit
def _score_kernel(
    logits_ptr,
    stride,
    V,
    params_ptr,
    pmax_ptr,
    pidx_ptr,
    pbad_ptr,
    pbest_ptr,
    pbid_ptr,
    C,
    BLOCK: tl.constexpr,
    CP: tl.constexpr,
):
    r = tl.program_id(0)
    c = tl.program_id(1)
    kind = tl.load(params_ptr + r * 6)
    if kind == 2:
        top, i0, bad = _row_top(pmax_ptr, pidx_ptr, pbad_ptr, r, C, CP)
        best = tl.full([], -float("inf"), tl.float64)
        bid = tl.full([], BIG_ID, tl.int32)
        if (bad == 0) & (top > -float("inf")):
            t = _param_f64(params_ptr, r, 1)
            min_p = _param_f64(params_ptr, r, 4)
            key = tl.load(params_ptr + r * 6 + 5).to(tl.uint64, bitcast=True)
            zmax = top.to(tl.float64) / t
            offs = c * BLOCK + tl.arange(0, BLOCK)
            valid = offs < V
            l = tl.load(logits_ptr + r * stride + offs, mask=valid, other=-float("inf"))
            l = l.to(tl.float32)
            fin = l > -float("inf")
            z = tl.where(fin, l.to(tl.float64) / t, -float("inf"))
            zc = tl.max(z, 0)
            # The first candidate survives every filter: its score bounds the winner's.
            live = zc + NOISE_BOUND >= zmax + _gumbel(key, i0)
            if min_p > 0.0:
                live = live & (tl.exp(zc - zmax) >= min_p)
            if live:
                keep = fin
                if min_p > 0.0:
                    keep = keep & (tl.exp(z - zmax) >= min_p)
                s = tl.where(keep, z + _gumbel(key, offs), -float("inf"))
                best = tl.max(s, 0)
                bid = tl.min(tl.where(keep & (s == best), offs, BIG_ID), 0)
        tl.store(pbest_ptr + r * C + c, best)
        tl.store(pbid_ptr + r * C + c, bid)


@triton.jit
def _top_k_draw(
    logits_ptr, stride, V, params_ptr, ptop_ptr, r, C, top, CP: tl.constexpr, K: tl.constexpr
):
    """Steps 2-6 for a top_k row from the chunks' first K candidates; a token or UNSETTLED."""
    t = _param_f64(params_ptr, r, 1)
    top_k = tl.load(params_ptr + r * 6 + 2)
    top_p = _param_f64(params_ptr, r, 3)
    min_p = _param_f64(params_ptr, r, 4)
    key = tl.load(params_ptr + r * 6 + 5).to(tl.uint64, bitcast=True)
    zmax = top.to(tl.float64) / t
    cc = tl.arange(0, CP)[:, None]
    kk = tl.arange(0, K)[None, :]
    keys = tl.load(ptop_ptr + (r * C + cc) * K + kk, mask=cc < C, other=KEY_PAD)
    first = tl.topk(tl.reshape(keys, [CP * K]), K)  # the row's first K candidates, in order
    j = tl.arange(0, K)
    ids = ((first & LOW32) ^ LOW32).to(tl.int32)
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
        n = tl.sum(kept.to(tl.int32), 0)
        cut = tl.sum(((running < target) & kept).to(tl.int32), 0)  # first index reaching it
        at = tl.sum(tl.where(j == cut, running, 0.0), 0)
        before = tl.sum(tl.where(j == cut - 1, running, 0.0), 0)
        before = tl.where(cut > 0, before, -float("inf"))
        # Two orders of summing n nonnegative terms differ by at most 2 n 2**-53 of the total;
        # twice that, as S, the running sums and exp may each differ from the CPU's (gpu.py).
        slack = ((tl.zeros([], tl.float64) + V) * 4.0 + 16.0) * 1.1102230246251565e-16 * total
        proven = target - before > slack
        proven = proven & ((at - target > slack) | (cut >= n))
        kept = kept & ((j <= cut) | (cut >= n))
        settled = proven
    if min_p > 0.0:
        kept = kept & (e >= min_p)
    s = tl.where(kept, z + _gumbel(key, ids), -float("inf"))
    best = tl.max(s, 0)
    token = tl.min(tl.where(kept & (s == best), ids, BIG_ID), 0).to(tl.int64)
    return tl.where(settled, token, -3)


@triton.jit
def _finish_kernel(
    logits_ptr,
    stride,
    V,
    params_ptr,
    pmax_ptr,
    pidx_ptr,
    pbad_ptr,
    pbest_ptr,
    pbid_ptr,
    ptop_ptr,
    out_ptr,
    C,
    CP: tl.constexpr,
    K: tl.constexpr,
):
    r = tl.program_id(0)
    kind = tl.load(params_ptr + r * 6)
    if kind != 0:
        top, i0, bad = _row_top(pmax_ptr, pidx_ptr, pbad_ptr, r, C, CP)
        res = tl.full([], -1, tl.int64)
        if bad != 0:
            res = tl.full([], -2, tl.int64)
        elif top > -float("inf"):
            if kind == 1:
                res = i0.to(tl.int64)
            elif kind == 2:
                cc = tl.arange(0, CP)
                m = cc < C
                pb = tl.load(pbest_ptr + r * C + cc, mask=m, other=-float("inf"))
                best = tl.max(pb, 0)
                pi = tl.load(pbid_ptr + r * C + cc, mask=m, other=BIG_ID)
                res = tl.min(tl.where(m & (pb == best), pi, BIG_ID), 0).to(tl.int64)
            else:
                res = _top_k_draw(logits_ptr, stride, V, params_ptr, ptop_ptr, r, C, top, CP, K)
        tl.store(out_ptr + r, res)


def _kind(spec: DrawSpec, vocab: int) -> int:
    p = spec.params
    if p.logit_bias or p.repetition_penalty != 1.0:
        return OTHER
    if p.presence_penalty != 0.0 or p.frequency_penalty != 0.0:
        return OTHER
    if p.temperature < GREEDY_TEMPERATURE:
        return GREEDY
    top_k = p.top_k if p.top_k < vocab else 0
    if top_k > 0:
        return TOP_K if top_k <= MAX_TOP_K else OTHER
    return PLAIN if p.top_p >= 1.0 else OTHER


def _table(specs: Sequence[DrawSpec], kinds: list[int], vocab: int) -> np.ndarray:
    """The kernels' parameter rows [n, NPARAM] int64 (floats as their bits)."""
    n = len(specs)
    table = np.zeros((n, NPARAM), dtype=np.int64)
    floats = np.zeros((n, 3), dtype=np.float64)
    keys = np.zeros(n, dtype=np.uint64)
    for i, (spec, kind) in enumerate(zip(specs, kinds)):
        if kind in (PLAIN, TOP_K):
            p = spec.params
            table[i, 2] = p.top_k if kind == TOP_K else 0
            floats[i] = (p.temperature, p.top_p, p.min_p)
            keys[i] = row_key(spec.seed, spec.position)
    table[:, 0] = kinds
    table[:, [1, 3, 4]] = floats.view(np.int64)
    table[:, 5] = keys.view(np.int64)
    return table


def draw_rows_fused(
    logits: torch.Tensor, specs: Sequence[DrawSpec], block: int = BLOCK
) -> list[int | SampleError | None]:
    """The draws of the rows the kernels take, None for the others (logits [N, V], fp32, bf16
    or fp16, on CUDA or, under TRITON_INTERPRET=1, the CPU). `block`: ids per program, a power
    of two (tests shrink it to cover many chunks)."""
    n, vocab = logits.shape
    kinds = [_kind(s, vocab) for s in specs]
    if logits.dtype not in DTYPES or not any(kinds):
        return [None] * n
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    dev = logits.device
    chunks = triton.cdiv(vocab, block)
    cp = triton.next_power_of_2(chunks)
    max_k = max((s.params.top_k for s, k in zip(specs, kinds) if k == TOP_K), default=0)
    k = min(max(16, triton.next_power_of_2(max_k)), block) if max_k else 16
    params = torch.from_numpy(_table(specs, kinds, vocab)).to(dev)
    pmax = torch.empty((n, chunks), dtype=torch.float32, device=dev)
    pidx = torch.empty((n, chunks), dtype=torch.int32, device=dev)
    pbad = torch.empty((n, chunks), dtype=torch.int32, device=dev)
    pbest = torch.empty((n, chunks), dtype=torch.float64, device=dev)
    pbid = torch.empty((n, chunks), dtype=torch.int32, device=dev)
    ptop = torch.empty((n, chunks, k) if max_k else (1,), dtype=torch.int64, device=dev)
    out = torch.empty(n, dtype=torch.int64, device=dev)
    stride = logits.stride(0)
    grid = (n, chunks)
    _stats_kernel[grid](
        logits, stride, vocab, params, pmax, pidx, pbad, ptop, chunks, block, k, num_warps=WARPS
    )
    if PLAIN in kinds:
        _score_kernel[grid](
            logits,
            stride,
            vocab,
            params,
            pmax,
            pidx,
            pbad,
            pbest,
            pbid,
            chunks,
            block,
            cp,
            num_warps=WARPS,
        )
    _finish_kernel[(n,)](
        logits,
        stride,
        vocab,
        params,
        pmax,
        pidx,
        pbad,
        pbest,
        pbid,
        ptop,
        out,
        chunks,
        cp,
        k,
        num_warps=WARPS,
    )
    results: list[int | SampleError | None] = []
    for kind, v in zip(kinds, out.tolist()):  # the one transfer
        if kind == OTHER or v in (BAD_LOGIT, UNSETTLED):
            results.append(None)  # the caller's path names the bad id, or settles the cut
        else:
            results.append(no_candidate(-math.inf) if v == NO_CANDIDATE else v)
    return results
