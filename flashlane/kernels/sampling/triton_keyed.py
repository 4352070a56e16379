"""Triton pieces shared by the fused draw kernels (triton_draw, triton_top_p): DESIGN.md section
5's keyed noise, the candidate order as int64 keys, the parameter table, and the workspace.

One int64 workspace holds everything a call needs on the device, in regions of 8-byte words
(floats stored as their bits), so a call makes one allocation:

    PARAMS [n, NPARAM]  copied from the host
    OUT    [n]          the token or status per row, the one transfer back
    MAX, IDX, BAD [n, C]  launch 1: each chunk's largest logit (float64 bits), its first id,
                          whether it holds a NaN or +inf
    BEST, BID [n, C, KP]  the score launch: each chunk's best scores (float64 bits) and ids,
                          best first (KP = 1 without top_p rows)
    MASS [n, C, KP + 1]   top_p rows: the mass before each of the row's KP best ids, then S
    KEYS [n, C, K]        top_k rows: each chunk's first K candidates as order keys
"""

from __future__ import annotations

import triton
import triton.language as tl

# Row kinds in the parameter table: the numbers of sampling/kinds.py, which the sampler's pure
# half imports without Triton (a test checks that they agree); the kernels compare literals.
OTHER, GREEDY, PLAIN, TOP_K, TOP_P = 0, 1, 2, 3, 4

NPARAM = 7  # kind, T, top_k, top_p, min_p, seed, position (floats as their int64 bits)
# Workspace regions, in order (constexprs, so kernels name them too).
PARAMS, OUT, MAX, IDX, BAD, BEST, BID, MASS, KEYS = (tl.constexpr(i) for i in range(9))
BIG_ID = tl.constexpr(2147483647)
KEY_PAD = tl.constexpr(-9223372036854775807)  # below every order key
LOW32 = tl.constexpr(4294967295)
NOISE_BOUND = tl.constexpr(37.0)  # above any noise the hash gives (36.74); exact in fp32 too


def workspace_words(n: int, chunks: int, kp: int, k: int) -> int:
    """Size of the workspace in int64 words (see the module docstring)."""
    return n * (NPARAM + 1) + n * chunks * (3 + 2 * kp + kp + 1 + k)


@triton.jit
def region(ws_ptr, n, C, which: tl.constexpr, KP: tl.constexpr):
    """The first word of workspace region `which` (PARAMS 0, OUT 1, ... KEYS 8, as above)."""
    off = 0
    if which > 0:
        off += n * 7  # PARAMS
    if which > 1:
        off += n  # OUT
    if which > 2:
        off += n * C  # MAX
    if which > 3:
        off += n * C  # IDX
    if which > 4:
        off += n * C  # BAD
    if which > 5:
        off += n * C * KP  # BEST
    if which > 6:
        off += n * C * KP  # BID
    if which > 7:
        off += n * C * (KP + 1)  # MASS
    return ws_ptr + off


@triton.jit
def splitmix64(x):
    """DESIGN.md's splitmix64 on uint64 (wrapping add and multiply, logical shifts)."""
    x = x + 0x9E3779B97F4A7C15
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB
    return x ^ (x >> 31)


@triton.jit
def gumbel(key, ids):
    """gumbel(uniform(seed, position, id)) in float64 for int ids, key = row_key (uint64)."""
    h = splitmix64(key ^ ids.to(tl.int64).to(tl.uint64, bitcast=True))
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
    """The ids of order keys."""
    return ((keys & LOW32) ^ LOW32).to(tl.int32)


@triton.jit
def param_f64(params_ptr, r, col: tl.constexpr):
    return tl.load(params_ptr + r * 7 + col).to(tl.float64, bitcast=True)


@triton.jit
def param_key(params_ptr, r):
    """row_key(seed, position) of row r, as uint64 (DESIGN.md: the first two hash rounds)."""
    seed = tl.load(params_ptr + r * 7 + 5).to(tl.uint64, bitcast=True)
    position = tl.load(params_ptr + r * 7 + 6).to(tl.uint64, bitcast=True)
    return splitmix64(splitmix64(seed) ^ position)


@triton.jit
def as_f64(words):
    return words.to(tl.float64, bitcast=True)


@triton.jit
def as_words(x):
    return x.to(tl.float64).to(tl.int64, bitcast=True)


@triton.jit
def row_top(ws_ptr, n, r, C, CP: tl.constexpr, KP: tl.constexpr):
    """The row's largest logit (float64), its first id, and whether a chunk saw a NaN or +inf."""
    cc = tl.arange(0, CP)
    m = cc < C
    at = r * C + cc
    pm = as_f64(tl.load(region(ws_ptr, n, C, MAX, KP) + at, mask=m, other=0))
    pm = tl.where(m, pm, -float("inf"))
    top = tl.max(pm, 0)
    pi = tl.load(region(ws_ptr, n, C, IDX, KP) + at, mask=m, other=BIG_ID)
    i0 = tl.min(tl.where(m & (pm == top), pi, BIG_ID), 0)
    bad = tl.max(tl.load(region(ws_ptr, n, C, BAD, KP) + at, mask=m, other=0), 0)
    return top, i0.to(tl.int32), bad


@triton.jit
def best_of(s, ids, valid):
    """The highest score of s (-inf where not valid) and its lowest id (BIG_ID if none)."""
    s = tl.where(valid, s, -float("inf"))
    best = tl.max(s, 0)
    bid = tl.min(tl.where(valid & (s == best), ids, BIG_ID), 0)
    return best, tl.where(best > -float("inf"), bid, BIG_ID)
