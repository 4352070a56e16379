"""Decode attention over each row's allowed keys, listed once and folded in slices (LISTED:
an experiment against triton_gather.py until timed, benchmarks/attention_decode.py).

triton_gather.py folds a range of key positions a program: at a 16k context one stream's
2,048 allowed keys lie in 8 ranges a kv head, 16 programs for 132 SMs, each folding 256 keys
in 8 dependent steps (~3.6 us each on the H200, latency-bound). Here three launches:
- list: program s of a row lists the allowed positions of [s * LIST_KEYS, (s + 1) *
  LIST_KEYS) in order (int16 offsets) and their count, once for all kv heads;
- fold: the row's list, in order, cut into slices of STEPS steps of BLOCK_L keys (at most
  SLICES slices, the last one taking the rest); program (row, kv head, s) folds slice s;
- combine: one program a (row, q head) folds its slices' partials at once.
Each launch may start as the one before it ends (kernels/pdl.py).

Bits: the slices are cut from the row's own list (its mask, length and position), whatever
the batch, the window and the session's capacity; the last fold reduces SLICES partials in
one fixed order. Not the bits of triton_gather.py (another grouping of the same keys).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.attention import triton_gather as gather
from flashlane.kernels.attention import triton_walk as walk
from flashlane.kernels.attention.triton_gather import (
    _bases,
    _fold,
    _group_q,
    _kv_loads,
    _list,
    _n_keys,
    _store_partial,
)
from flashlane.kernels.pdl import enter, pdl
from flashlane.kernels.tables import no_longs, no_scales, no_table

LISTED = False  # triton.attention's split calls through here instead of triton_gather.py
LIST_KEYS = 2048  # key positions a listing program reads (int16 offsets: <= 32,768)
CHUNK = 1024  # mask bytes a listing step reads
SLICES = 32  # fold programs a (row, kv head): a row's partials
STEPS = 2  # steps of gather.BLOCK_L keys a slice (a 2,048-key budget: 32 slices of 2)
# warps of a fold program; on 4 its sm_90 code keeps 21 values in local memory, on 8 none
# (benchmarks/sass_census.py), untimed: benchmarks/attention_decode.py times both
FOLD_WARPS = 4
# an 8-bit cache's fold (FP8, kv8.py): overrides of its keys a step and steps a slice
# (BLOCK_L, STEPS: other bits, the same for every row) and launch options (num_warps,
# num_stages). Its sm_90 code on today's is 7,224 instructions with 104 local stores and the
# loads pipelined through shared memory (bf16's: 2,384, 21); it took 38 us a layer against
# bf16's 13 in one-stream timelines (H100, 71,808-key sessions). In steps of 16 keys (4 a
# slice) its code is 2,360 with none in local memory. benchmarks/attention_decode.py --kv8
# times the candidates
FOLD_OPTIONS8: dict = {}
_LAUNCH = ("num_warps", "num_stages")


@triton.jit
def _slices(count_ptr, i_bt, R, BR: tl.constexpr, BLOCK_L: tl.constexpr, STEPS: tl.constexpr,
            SLICES: tl.constexpr):  # fmt: skip
    """Row i_bt's list: (each range's end in it [BR], its length, its steps, its slices)."""
    rr = tl.arange(0, BR)
    counts = tl.load(count_ptr + i_bt.to(tl.int64) * R + rr, mask=rr < R, other=0)
    total = tl.sum(counts, axis=0)
    steps = tl.cdiv(total, BLOCK_L)
    return tl.cumsum(counts, axis=0), total, steps, tl.minimum(tl.cdiv(steps, STEPS), SLICES)


@triton.jit(do_not_specialize=["T", "L", "R", "HAS_LEN", "HAS_POS"])
def _list_kernel(mask_ptr, len_ptr, pos_ptr, list_ptr, count_ptr, HAS_LEN, HAS_POS, T, L, R,
                 RANGE: tl.constexpr, CHUNK: tl.constexpr, PDL: tl.constexpr = 0):  # fmt: skip
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    i_bt = tl.program_id(0)
    i_s = tl.program_id(1)
    n_keys = _n_keys(len_ptr, pos_ptr, i_bt // T, i_bt, L, HAS_LEN, HAS_POS)
    lo = i_s * RANGE
    at = i_bt.to(tl.int64) * R + i_s
    dst = list_ptr + at * RANGE
    count = _list(
        mask_ptr + i_bt.to(tl.int64) * L, lo, tl.minimum(n_keys, lo + RANGE), dst, lo, CHUNK
    )
    tl.store(count_ptr + at, count)


@triton.jit(do_not_specialize=["T", "R", "HKV", "stride_b", "HAS_TABLE"])
def _fold_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    tab_ptr,
    ks_ptr,
    vs_ptr,
    list_ptr,
    count_ptr,
    pm_ptr,
    pl_ptr,
    pa_ptr,
    HAS_TABLE,
    T,
    R,
    HKV,
    stride_b,
    scale,
    HQ: tl.constexpr,
    REP: tl.constexpr,
    D: tl.constexpr,
    BD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BR: tl.constexpr,
    RANGE: tl.constexpr,
    STEPS: tl.constexpr,
    SLICES: tl.constexpr,
    PRECISION: tl.constexpr,
    FP8: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    enter(PDL)
    i_bt = tl.program_id(0)
    i_kv = tl.program_id(1)
    i_s = tl.program_id(2)
    ends, total, steps, used = _slices(count_ptr, i_bt, R, BR, BLOCK_L, STEPS, SLICES)
    if i_s < used:
        i_b = i_bt // T
        q, head, m_r = _group_q(q_ptr, i_bt, i_kv, HQ, REP, D, BD, BLOCK_M)
        bases = _bases(
            k_ptr, v_ptr, ks_ptr, vs_ptr, tab_ptr, i_b, i_kv, stride_b, HKV, HAS_TABLE, D, FP8
        )
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BD], dtype=tl.float32)
        last = tl.where(i_s == used - 1, steps, (i_s + 1) * STEPS)
        for st in range(i_s * STEPS, last):
            j = st * BLOCK_L + tl.arange(0, BLOCK_L)
            m_j = j < total
            # list index j lies in the first range that ends past it, from that range's start
            before = ends[None, :] <= j[:, None]
            r_j = tl.sum(before.to(tl.int32), axis=1)
            start = tl.max(tl.where(before, ends[None, :], 0), axis=1)
            at = (i_bt.to(tl.int64) * R + r_j) * RANGE + (j - start)
            keys = r_j * RANGE + tl.load(list_ptr + at, mask=m_j, other=0).to(tl.int32)
            k, v = _kv_loads(keys, m_j, bases, HKV, q.dtype, D, BD, FP8)
            m_i, l_i, acc = _fold(q, k, v, m_j, m_i, l_i, acc, scale, PRECISION)
        at = (i_s * tl.num_programs(0) + i_bt).to(tl.int64) * HQ + head
        _store_partial(pm_ptr, pl_ptr, pa_ptr, at, m_r, m_i, l_i, acc, D, BD)


@triton.jit(do_not_specialize=["R", "rows", "HQ"])
def _combine_kernel(pm_ptr, pl_ptr, pa_ptr, count_ptr, o_ptr, R, rows, HQ, BR: tl.constexpr,
                    BLOCK_L: tl.constexpr, STEPS: tl.constexpr, SLICES: tl.constexpr,
                    BS: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                    PDL: tl.constexpr = 0):  # fmt: skip
    enter(PDL)
    r = tl.program_id(0)  # a (row, q head)
    _, _, _, used = _slices(count_ptr, r // HQ, R, BR, BLOCK_L, STEPS, SLICES)
    s = tl.arange(0, BS)
    d = tl.arange(0, BD)
    m_s = s < used
    at = s.to(tl.int64) * rows + r
    m = tl.load(pm_ptr + at, mask=m_s, other=float("-inf"))
    l = tl.load(pl_ptr + at, mask=m_s, other=0.0)
    acc = tl.load(
        pa_ptr + at[:, None] * D + d[None, :], mask=m_s[:, None] & (d < D)[None, :], other=0.0
    )
    top = tl.max(m, axis=0)
    w = tl.exp(m - tl.where(top == float("-inf"), 0.0, top))  # an unused slice weighs 0
    l_sum = tl.sum(w * l, axis=0)
    out = tl.sum(w[:, None] * acc, axis=0) / tl.where(l_sum > 0, l_sum, 1.0)
    out = tl.where(l_sum > 0, out, float("nan"))
    tl.store(o_ptr + r.to(tl.int64) * D + d, out.to(o_ptr.dtype.element_ty), mask=d < D)


def attention_listed(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    lengths: torch.Tensor | None = None,
    table: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """triton_gather.attention_gathered's arguments and contract (a row that allows no key
    gives NaN), the allowed keys listed once a row and folded in slices."""
    gather.check(q, k, v, mask, scales, table, lengths, "attention_listed")
    b, t, hq, d = q.shape
    hkv, l = k.shape[2], mask.shape[-1]
    o = torch.empty_like(q)
    if b == 0 or t == 0:
        return o
    dev = q.device
    ranges = max(triton.cdiv(l, LIST_KEYS), 1)
    lists = torch.empty(b * t * ranges * LIST_KEYS, dtype=torch.int16, device=dev)
    counts = torch.empty(b * t * ranges, dtype=torch.int32, device=dev)
    parts = walk.partials(SLICES, b * t * hq, d, dev)
    if positions is not None:
        positions = positions.to(torch.long).expand(b, t).contiguous()
    _list_kernel[(b * t, ranges)](
        mask.contiguous().view(torch.uint8),
        no_longs(dev) if lengths is None else lengths,
        no_longs(dev) if positions is None else positions,
        lists,
        counts,
        int(lengths is not None),
        int(positions is not None),
        t,
        l,
        ranges,
        RANGE=LIST_KEYS,
        CHUNK=CHUNK,
        num_warps=4,
        **pdl(dev),
    )
    br, bd = max(16, triton.next_power_of_2(ranges)), triton.next_power_of_2(d)
    tune = FOLD_OPTIONS8 if scales is not None else {}
    block_l, steps = tune.get("BLOCK_L", gather.BLOCK_L), tune.get("STEPS", STEPS)
    launch = {"num_warps": FOLD_WARPS, **{o: tune[o] for o in _LAUNCH if o in tune}}
    ks, vs = (s.contiguous() for s in scales) if scales is not None else (no_scales(dev),) * 2
    _fold_kernel[(b * t, hkv, SLICES)](
        q.contiguous(),
        k.contiguous(),
        v.contiguous(),
        no_table(dev) if table is None else table,
        ks,
        vs,
        lists,
        counts,
        *parts,
        int(table is not None),
        t,
        ranges,
        hkv,
        k.shape[1],
        float(scale),
        HQ=hq,
        REP=hq // hkv,
        D=d,
        BD=bd,
        BLOCK_M=max(16, triton.next_power_of_2(hq // hkv)),
        BLOCK_L=block_l,
        BR=br,
        RANGE=LIST_KEYS,
        STEPS=steps,
        SLICES=SLICES,
        PRECISION=gather.PRECISION[q.dtype],
        FP8=scales is not None,
        **launch,
        **pdl(dev),
    )
    _combine_kernel[(b * t * hq,)](
        *parts,
        counts,
        o,
        ranges,
        b * t * hq,
        hq,
        BR=br,
        BLOCK_L=block_l,
        STEPS=steps,
        SLICES=SLICES,
        BS=triton.next_power_of_2(SLICES),
        D=d,
        BD=bd,
        num_warps=4,
        **pdl(dev),
    )
    return o
