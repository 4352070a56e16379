"""Causal attention in Triton (the siblings' gated full attention): attention() of triton.py
with the mask computed from the rows' positions instead of read from a [B, T, L] tensor.

One program per (query tile, b, kv head), the tiles of the masked kernel (CONFIGS: by dtype
alone, never by T, B or L); it walks the key blocks from 0 up to its last row's position in
a fixed order with the same online softmax. A row's allowed keys are exactly those a causal
mask allows, so a row's bits equal the masked kernel's with that mask (a test checks it),
and they depend on the row, its keys and its position alone: a block a row may not see
leaves its state bitwise unchanged (p = 0, rescale 1), whatever shares its tile.
Prefill (a piece's T rows) and decode (windows of a few rows) run the same kernel, and so
does a lone step's row for each of B sessions (`causal_sessions`: batch b reads session b's
caches in place through a table of offsets, a runtime flag of the same compiled kernel).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.attention.triton import CONFIGS
from flashlane.kernels.attention.triton_blocks import put_rows
from flashlane.kernels.pdl import enter, pdl
from flashlane.kernels.session_tables import attn_table
from flashlane.kernels.tables import K_COL, TABLE_WIDTH, V_COL, no_longs, no_table

# a table's sessions may differ in capacity: their lengths bound the walk, not L
NO_LIMIT = 2**31 - 1


@triton.jit(do_not_specialize=["T", "L", "HQ", "HKV", "REP", "HAS_LEN", "HAS_TABLE"])
def _causal_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    pos_ptr,
    o_ptr,
    len_ptr,
    tab_ptr,
    HAS_LEN,
    HAS_TABLE,
    T,
    L,
    HQ,
    HKV,
    REP,
    scale,
    D: tl.constexpr,
    BD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_L: tl.constexpr,
    PRECISION: tl.constexpr,
    SKIP: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    i_m = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // HKV
    i_kv = i_bh % HKV

    rows = i_m * BLOCK_M + tl.arange(0, BLOCK_M)  # flat (token, head-in-group) index
    m_rows = rows < REP * T
    tok = rows // REP
    head = i_kv * REP + rows % REP
    d = tl.arange(0, BD)
    m_d = d < D

    q_ptr += i_b.to(tl.int64) * T * HQ * D
    o_ptr += i_b.to(tl.int64) * T * HQ * D
    # batch b's keys and values, or session b's caches through the table (element offsets
    # from the first session's)
    k_off = i_b.to(tl.int64) * L * HKV * D
    v_off = k_off
    if HAS_TABLE != 0:
        k_off = tl.multiple_of(tl.load(tab_ptr + i_b * TABLE_WIDTH + K_COL), 16)
        v_off = tl.multiple_of(tl.load(tab_ptr + i_b * TABLE_WIDTH + V_COL), 16)
    k_ptr += k_off + i_kv * D
    v_ptr += v_off + i_kv * D
    q_row = (tok * HQ + head) * D  # [BLOCK_M]
    q = tl.load(q_ptr + q_row[:, None] + d[None, :], mask=m_rows[:, None] & m_d[None, :], other=0.0)
    # a row past the tile's end sees nothing (-1): its state stays empty and is not stored
    p_i = tl.load(pos_ptr + i_b.to(tl.int64) * T + tok, mask=m_rows, other=-1).to(tl.int32)
    n_keys = L
    if HAS_LEN != 0:
        n_keys = tl.minimum(tl.load(len_ptr + i_b).to(tl.int32), L)
    hi = tl.minimum(n_keys, tl.max(p_i) + 1)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BD], dtype=tl.float32)
    for l0 in range(0, hi, BLOCK_L):
        keys = l0 + tl.arange(0, BLOCK_L)
        m_keys = keys < n_keys
        allowed = (keys[None, :] <= p_i[:, None]) & m_keys[None, :] & m_rows[:, None]
        go = True
        if SKIP:
            go = tl.max(allowed.to(tl.int32)) > 0
        if go:
            kv_row = keys * (HKV * D)
            m_kd = m_keys[:, None] & m_d[None, :]
            k = tl.load(k_ptr + kv_row[:, None] + d[None, :], mask=m_kd, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
            s = tl.where(allowed, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            # a row that has seen no key keeps m = -inf: subtract 0, so no NaN (p = 0)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(v_ptr + kv_row[:, None] + d[None, :], mask=m_kd, other=0.0)
            acc = acc * alpha[:, None]
            acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
            m_i = m_new

    seen = l_i > 0
    out = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], float("nan"))
    tl.store(
        o_ptr + q_row[:, None] + d[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=m_rows[:, None] & m_d[None, :],
    )


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    positions: torch.Tensor,
    lengths: torch.Tensor | None = None,
    config: tuple | None = None,
) -> torch.Tensor:
    """reference.causal_attention: q [B, T, Hq, D]; k, v [B, L, Hkv, D]; positions [B, T]
    (row (b, t) sees keys 0 .. positions[b, t]) -> [B, T, Hq, D] in q's dtype; fp32 scores
    and softmax. `lengths` ([B]): keys at or past lengths[b] are never read. `config`
    replaces CONFIGS[dtype] (tests, benchmarks)."""
    b, t, hq, d = q.shape
    l, hkv = k.shape[1], k.shape[2]
    out_dtype = q.dtype
    if k.dtype not in CONFIGS:
        k = k.float()
    block_m, block_l, warps, stages, precision, skip = config or CONFIGS[k.dtype]
    q = q.to(k.dtype).contiguous()
    k, v = k.contiguous(), v.to(k.dtype).contiguous()
    o = torch.empty(b, t, hq, d, dtype=out_dtype, device=q.device)
    if t == 0 or b == 0:
        return o
    positions = positions.to(torch.long).expand(b, t).contiguous()
    grid = (triton.cdiv(hq // hkv * t, block_m), b * hkv)
    _causal_kernel[grid](
        q, k, v, positions, o, no_longs(q.device) if lengths is None else lengths,
        no_table(q.device), int(lengths is not None), 0, t, l, hq, hkv, hq // hkv, float(scale),
        D=d, BD=triton.next_power_of_2(d), BLOCK_M=block_m, BLOCK_L=block_l,
        PRECISION=precision, SKIP=skip, num_warps=warps, num_stages=stages, **pdl(q.device),
    )  # fmt: skip
    return o


def causal_sessions(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    caches: list,
    pos: torch.Tensor,
    scale: float,
    table: torch.Tensor | None = None,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """reference.causal_sessions in three launches whatever B: session i's k[i], v[i]
    written at pos[i], then q[i]'s causal attention over session i's cache read in place
    (`table`: session_tables.attn_table, built here when not given; a CUDA graph needs it
    built before its capture). q [B, Hq, D]; k, v [B, Hkv, D]; pos [B] on the device;
    lengths: pos + 1 where the caller made it once -> o [B, Hq, D]. The kernel is
    causal_attention's with its tiles, so a row's bits are those of its decode window in a
    shared round."""
    first = caches[0]
    if first.k_scale is not None:
        raise ValueError("causal_sessions: 16-bit caches only (an 8-bit cache: shared rounds)")
    table = attn_table(caches) if table is None else table
    put_rows(first.k, "k", table, pos, k)
    put_rows(first.v, "v", table, pos, v)
    lengths = pos + 1 if lengths is None else lengths
    (b, hq, d), out_dtype = q.shape, q.dtype
    hkv = first.k.shape[1]
    block_m, block_l, warps, stages, precision, skip = CONFIGS[first.k.dtype]
    q = q.to(first.k.dtype).contiguous()
    o = torch.empty(b, 1, hq, d, dtype=out_dtype, device=q.device)
    grid = (triton.cdiv(hq // hkv, block_m), b * hkv)
    _causal_kernel[grid](
        q, first.k, first.v, pos.contiguous(), o, lengths, table, 1, 1, 1, NO_LIMIT, hq, hkv,
        hq // hkv, float(scale), D=d, BD=triton.next_power_of_2(d), BLOCK_M=block_m,
        BLOCK_L=block_l, PRECISION=precision, SKIP=skip, num_warps=warps, num_stages=stages,
        **pdl(q.device),
    )  # fmt: skip
    return o[:, 0]
