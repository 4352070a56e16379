"""Triton pieces shared by the fused draw kernels (triton_draw, triton_top_p): DESIGN.md section
5's keyed noise, the candidate order as int64 keys, and the reads of the parameter table and of
launch 1's per-chunk maxima."""

from __future__ import annotations

import triton
import triton.language as tl

NPARAM = 6  # kind, T, top_k, top_p, min_p, row key (floats as their int64 bits)
BIG_ID = tl.constexpr(2147483647)
KEY_PAD = tl.constexpr(-9223372036854775807)  # below every order key
LOW32 = tl.constexpr(4294967295)
NOISE_BOUND = tl.constexpr(37.0)  # above any noise the hash gives (36.74); exact in fp32 too


@triton.jit
def _splitmix64(x):
    """DESIGN.md's splitmix64 on uint64 (wrapping add and multiply, logical shifts)."""
    x = x + 0x9E3779B97F4A7C15
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB
    return x ^ (x >> 31)


@triton.jit
def gumbel(key, ids):
    """gumbel(uniform(seed, position, id)) in float64 for int ids, key = row_key (uint64)."""
    h = _splitmix64(key ^ ids.to(tl.int64).to(tl.uint64, bitcast=True))
    u = ((h >> 12).to(tl.float64) + 0.5) * 2.220446049250313e-16  # 2**-52, exact
    return -tl.log(-tl.log(u))


@triton.jit
def order_key(l, ids):
    """int64 keys that sort like the candidate order, descending: the fp32 logit's bits made
    monotone (-0.0 as +0.0, so they tie) above 2**32 - 1 - id (ties to the lower id)."""
    l = tl.where(l == 0.0, 0.0, l)
    b = l.to(tl.int32, bitcast=True)
    b = tl.where(b < 0, b ^ 0x7FFFFFFF, b)
    return (b.to(tl.int64) << 32) | (ids.to(tl.int64) ^ LOW32)  # ^: 2**32 - 1 - id


@triton.jit
def key_ids(keys):
    """The ids of order keys (KEY_PAD gives a negative id)."""
    return ((keys & LOW32) ^ LOW32).to(tl.int32)


@triton.jit
def param_f64(params_ptr, r, col: tl.constexpr):
    return tl.load(params_ptr + r * 6 + col).to(tl.float64, bitcast=True)


@triton.jit
def param_key(params_ptr, r):
    return tl.load(params_ptr + r * 6 + 5).to(tl.uint64, bitcast=True)


@triton.jit
def row_top(pmax_ptr, pidx_ptr, pbad_ptr, r, C, CP: tl.constexpr):
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
def row_best(pbest_ptr, pbid_ptr, r, C, CP: tl.constexpr):
    """The best of the chunks' best scores and its lowest id (BIG_ID when every one is -inf)."""
    cc = tl.arange(0, CP)
    m = cc < C
    pb = tl.load(pbest_ptr + r * C + cc, mask=m, other=-float("inf"))
    best = tl.max(pb, 0)
    pi = tl.load(pbid_ptr + r * C + cc, mask=m, other=BIG_ID)
    bid = tl.min(tl.where(m & (pb == best), pi, BIG_ID), 0)
    return best, tl.where(best > -float("inf"), bid, BIG_ID)
