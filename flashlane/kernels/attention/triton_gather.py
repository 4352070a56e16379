"""Decode attention that reads only each row's allowed keys (issue 29's long contexts).

Under QSA a decode row at a 128k context sees 2,048 keys in blocks of 4 spread over the whole
cache. The walks (triton.py, triton_walk.py) load key blocks of 32 positions, and a block that
holds one allowed key is loaded whole: at random selections most of the cache. Here program s of
a (row, kv head) takes the key positions [s * RANGE_KEYS, (s + 1) * RANGE_KEYS) as the split
walk does, reads their mask bytes once, lists the allowed positions in order in a scratch row of
its own (a prefix sum and a scattered store), then gathers BLOCK_L listed keys and values a step
into its online softmax. Its partial (m, l, acc) folds in range order (triton_walk.combine);
a call of one range divides in the kernel, as combine would.

Bits: a row's result is a function of its own mask, keys and position alone (ranges are fixed
key positions, steps fixed indices of the range's list, a range past the row's position leaves
an empty partial that folds exactly), so the same whatever the batch, the window and the other
sessions. They are not the walks' bits (another grouping of the same keys): `attention_gathered`
takes the arguments of triton.attention with split=True; benchmarks/attention_decode.py times it
against the walks. The default for decode windows (triton.GATHER); `--kernels walk` the walk.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.attention import triton_walk as walk
from flashlane.kernels.attention.kv8 import FP8
from flashlane.kernels.tables import (
    K_COL,
    KS_COL,
    TABLE_WIDTH,
    V_COL,
    VS_COL,
    no_longs,
    no_scales,
    no_table,
)

RANGE_KEYS = 2048  # key positions one program lists and folds (planning/buffers.SPLIT_KEYS)
CHUNK = 1024  # mask bytes a listing step reads
BLOCK_L = 32  # listed keys a step gathers
PRECISION = {torch.float32: "ieee", torch.bfloat16: "tf32", torch.float16: "tf32"}


@triton.jit
def _n_keys(len_ptr, pos_ptr, i_b, i_bt, L, HAS_LEN, HAS_POS):
    """The keys row (i_b, i_bt) may see: its cache's, its session's length, its position + 1."""
    n_keys = L
    if HAS_LEN != 0:
        n_keys = tl.minimum(tl.load(len_ptr + i_b).to(tl.int32), L)
    if HAS_POS != 0:
        n_keys = tl.minimum(n_keys, tl.load(pos_ptr + i_bt).to(tl.int32) + 1)
    return n_keys


@triton.jit
def _bases(k_ptr, v_ptr, ks_ptr, vs_ptr, tab_ptr, i_b, i_kv, stride_b, HKV, HAS_TABLE,
           D: tl.constexpr, FP8: tl.constexpr):  # fmt: skip
    """Batch i_b's keys, values and scales of kv head i_kv (stride_b: rows a batch), or
    session i_b's through the table."""
    k_off = i_b.to(tl.int64) * stride_b * HKV * D
    v_off = k_off
    ks_off = i_b.to(tl.int64) * stride_b * HKV
    vs_off = ks_off
    if HAS_TABLE != 0:
        # whole multiples of 16 elements (session_tables.offsets_table checks): rows of D
        # values load 16 bytes a thread, not 2
        k_off = tl.multiple_of(tl.load(tab_ptr + i_b * TABLE_WIDTH + K_COL), 16)
        v_off = tl.multiple_of(tl.load(tab_ptr + i_b * TABLE_WIDTH + V_COL), 16)
        if FP8:
            ks_off = tl.load(tab_ptr + i_b * TABLE_WIDTH + KS_COL)
            vs_off = tl.load(tab_ptr + i_b * TABLE_WIDTH + VS_COL)
    k = k_ptr + k_off + i_kv * D
    v = v_ptr + v_off + i_kv * D
    return k, v, ks_ptr + ks_off + i_kv, vs_ptr + vs_off + i_kv


@triton.jit
def _list(mask_row, lo, hi, dst, shift, CHUNK: tl.constexpr):
    """The allowed positions of [lo, hi) in order, less `shift`, stored from dst: their count."""
    count = 0
    for c0 in range(lo, hi, CHUNK):
        p = c0 + tl.arange(0, CHUNK)
        m_p = p < hi
        seen = tl.load(mask_row + p, mask=m_p, other=0) != 0
        ones = seen.to(tl.int32)
        at = count + tl.cumsum(ones, axis=0) - ones
        tl.store(dst + at, (p - shift).to(dst.dtype.element_ty), mask=seen)
        count += tl.sum(ones)
    return count


@triton.jit
def _kv_loads(keys, m_j, bases, HKV, dtype, D: tl.constexpr, BD: tl.constexpr,
              FP8: tl.constexpr):  # fmt: skip
    """The keys and values [len(keys), BD] at key positions `keys` (where m_j) in the compute
    dtype (an 8-bit cache's times its rows' scales, kv8.py)."""
    k_ptr, v_ptr, ks_ptr, vs_ptr = bases
    d = tl.arange(0, BD)
    row = keys.to(tl.int64) * HKV * D
    m_kd = m_j[:, None] & (d < D)[None, :]
    k = tl.load(k_ptr + row[:, None] + d[None, :], mask=m_kd, other=0.0)
    v = tl.load(v_ptr + row[:, None] + d[None, :], mask=m_kd, other=0.0)
    if FP8:  # e4m3 times its row's scale in fp32, rounded to the compute dtype
        ks = tl.load(ks_ptr + keys.to(tl.int64) * HKV, mask=m_j, other=0.0)
        vs = tl.load(vs_ptr + keys.to(tl.int64) * HKV, mask=m_j, other=0.0)
        k = (k.to(tl.float32) * ks[:, None]).to(dtype)
        v = (v.to(tl.float32) * vs[:, None]).to(dtype)
    return k, v


@triton.jit
def _fold(q, k, v, m_j, m_i, l_i, acc, scale, PRECISION: tl.constexpr):
    """One step of the online softmax over the listed keys `m_j` -> (m_i, l_i, acc)."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
    s = tl.where(m_j[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(s - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def _group_q(q_ptr, i_bt, i_kv, HQ: tl.constexpr, REP: tl.constexpr, D: tl.constexpr,
             BD: tl.constexpr, BLOCK_M: tl.constexpr):  # fmt: skip
    """Row i_bt's queries of the q heads of kv head i_kv: (q [BLOCK_M, BD], heads, m_r)."""
    r = tl.arange(0, BLOCK_M)
    m_r = r < REP
    head = i_kv * REP + r
    d = tl.arange(0, BD)
    q_row = (i_bt.to(tl.int64) * HQ + head) * D
    q = tl.load(
        q_ptr + q_row[:, None] + d[None, :], mask=m_r[:, None] & (d < D)[None, :], other=0.0
    )
    return q, head, m_r


@triton.jit
def _store_partial(pm_ptr, pl_ptr, pa_ptr, at, m_w, m_i, l_i, acc, D: tl.constexpr,
                   BD: tl.constexpr):  # fmt: skip
    """(m, l, acc) at partial rows `at` where m_w."""
    d = tl.arange(0, BD)
    tl.store(pm_ptr + at, m_i, mask=m_w)
    tl.store(pl_ptr + at, l_i, mask=m_w)
    tl.store(pa_ptr + at[:, None] * D + d[None, :], acc, mask=m_w[:, None] & (d < D)[None, :])


@triton.jit(do_not_specialize=["T", "L", "HKV", "stride_b", "HAS_LEN", "HAS_TABLE", "HAS_POS"])
def _gather_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    mask_ptr,
    o_ptr,
    len_ptr,
    tab_ptr,
    pos_ptr,
    ks_ptr,
    vs_ptr,
    list_ptr,
    pm_ptr,
    pl_ptr,
    pa_ptr,
    HAS_LEN,
    HAS_TABLE,
    HAS_POS,
    T,
    L,
    HKV,
    stride_b,
    scale,
    HQ: tl.constexpr,
    REP: tl.constexpr,
    D: tl.constexpr,
    BD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_L: tl.constexpr,
    RANGE: tl.constexpr,
    CHUNK: tl.constexpr,
    PRECISION: tl.constexpr,
    FP8: tl.constexpr,
):
    i_bt = tl.program_id(0)  # (batch, token)
    i_kv = tl.program_id(1)
    i_s = tl.program_id(2)
    i_b = i_bt // T
    q, head, m_r = _group_q(q_ptr, i_bt, i_kv, HQ, REP, D, BD, BLOCK_M)
    bases = _bases(
        k_ptr, v_ptr, ks_ptr, vs_ptr, tab_ptr, i_b, i_kv, stride_b, HKV, HAS_TABLE, D, FP8
    )
    n_keys = _n_keys(len_ptr, pos_ptr, i_b, i_bt, L, HAS_LEN, HAS_POS)
    lo = i_s * RANGE
    hi = tl.minimum(n_keys, lo + RANGE)
    # the range's allowed positions in order (offsets from lo, int16: RANGE <= 32,768) in
    # this program's scratch row of RANGE
    mine = list_ptr + ((i_bt * HKV + i_kv) * tl.num_programs(2) + i_s).to(tl.int64) * RANGE
    count = _list(mask_ptr + i_bt.to(tl.int64) * L, lo, hi, mine, lo, CHUNK)
    tl.debug_barrier()  # the list's stores before its loads, across the program's threads

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BD], dtype=tl.float32)
    for j0 in range(0, count, BLOCK_L):
        j = j0 + tl.arange(0, BLOCK_L)
        m_j = j < count
        keys = lo + tl.load(mine + j, mask=m_j, other=0).to(tl.int32)
        k, v = _kv_loads(keys, m_j, bases, HKV, q.dtype, D, BD, FP8)
        m_i, l_i, acc = _fold(q, k, v, m_j, m_i, l_i, acc, scale, PRECISION)
    if tl.num_programs(2) > 1:  # a range's partial, laid out as the split walk's; one past
        # the row's last key is not written (combine folds only the ranges below it)
        at = (i_s * tl.num_programs(0) + i_bt).to(tl.int64) * HQ + head
        _store_partial(pm_ptr, pl_ptr, pa_ptr, at, m_r & (lo < n_keys), m_i, l_i, acc, D, BD)
    else:
        d = tl.arange(0, BD)
        seen = l_i > 0
        out = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], float("nan"))
        o = out.to(o_ptr.dtype.element_ty)
        q_row = (i_bt.to(tl.int64) * HQ + head) * D
        tl.store(o_ptr + q_row[:, None] + d[None, :], o, mask=m_r[:, None] & (d < D)[None, :])


def check(q, k, v, mask, scales, table, lengths, name: str) -> None:
    """The shapes and dtypes the gathered kernels take, or a ValueError naming them."""
    b, t, hq, _ = q.shape
    hkv = k.shape[2]
    eight = scales is not None
    if mask.shape[:2] != (b, t) or v.shape[2] != hkv or hq % hkv:
        shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, mask {tuple(mask.shape)}"
        raise ValueError(f"{name}: {shapes}")
    if q.dtype not in PRECISION or (k.dtype, v.dtype) != ((FP8,) * 2 if eight else (q.dtype,) * 2):
        raise ValueError(f"{name}: q, k, v of {q.dtype}, {k.dtype}, {v.dtype}")
    if table is not None and lengths is None:
        raise ValueError(f"{name}: a table needs lengths")


def attention_gathered(
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
    """triton.attention(..., split=True) reading only each row's allowed keys: q [B, T, Hq, D];
    k, v [B, L, Hkv, D] in q's dtype, or e4m3 with `scales`; mask [B, T, L] bool -> [B, T, Hq,
    D] in q's dtype; lengths, table, positions, scales as there. A row that allows no key
    gives NaN, as the walks do."""
    check(q, k, v, mask, scales, table, lengths, "attention_gathered")
    b, t, hq, d = q.shape
    hkv = k.shape[2]
    l = mask.shape[-1]
    eight = scales is not None
    o = torch.empty_like(q)
    if b == 0 or t == 0:
        return o
    ranges = max(triton.cdiv(l, RANGE_KEYS), 1)
    lists = torch.empty(b * t * hkv * ranges * RANGE_KEYS, dtype=torch.int16, device=q.device)
    parts = walk.partials(ranges, b * t * hq, d, q.device) if ranges > 1 else (o,) * 3
    if positions is not None:
        positions = positions.to(torch.long).expand(b, t).contiguous()
    ks, vs = (s.contiguous() for s in scales) if eight else (no_scales(q.device),) * 2
    _gather_kernel[(b * t, hkv, ranges)](
        q.contiguous(),
        k.contiguous(),
        v.contiguous(),
        mask.contiguous().view(torch.uint8),
        o,
        no_longs(q.device) if lengths is None else lengths,
        no_table(q.device) if table is None else table,
        no_longs(q.device) if positions is None else positions,
        ks,
        vs,
        lists,
        *parts,
        int(lengths is not None),
        int(table is not None),
        int(positions is not None),
        t,
        l,
        hkv,
        k.shape[1],
        float(scale),
        HQ=hq,
        REP=hq // hkv,
        D=d,
        BD=triton.next_power_of_2(d),
        BLOCK_M=max(16, triton.next_power_of_2(hq // hkv)),
        BLOCK_L=BLOCK_L,
        RANGE=RANGE_KEYS,
        CHUNK=CHUNK,
        PRECISION=PRECISION[q.dtype],
        FP8=eight,
        num_warps=4,
    )
    return walk.combine(parts, o, RANGE_KEYS, l, lengths, positions) if ranges > 1 else o
