"""QSA sparse attention in Triton: masked attention with grouped KV heads, and the indexer scores.
Same signatures and results as flashlane.kernels.attention.reference; needs triton.

attention: one program per (query tile, b, kv head). A query tile is BLOCK_M rows of the
(token, grouped q head) pairs of one kv head, token-major as in the reference, so the q heads
that share a kv head share its key loads. The program walks the keys in blocks of BLOCK_L
from key 0 upward (online softmax in fp32, a fixed order) and may skip a key block that no
row of the tile may see. Row invariance: the tile shapes are fixed (never chosen by T, B or
L), scores and the softmax state are per row, and a key block that a row may not see leaves
that row's state bitwise unchanged (scores -inf, so p = 0 and the rescale exactly 1; a row
that has seen nothing yet keeps m = -inf, l = 0, acc = 0 without NaN), so skipping or not,
and whatever shares the tile, changes nothing for a row. A row with no allowed key gets NaN,
like the reference's softmax over nothing (never for a causal mask: its diagonal is allowed).
select_mask, index_scores: the indexer (triton_select.py, triton_scores.py); attend_sessions
(triton_sessions.py): a lone step's attention for several sessions at once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.attention import triton_gather as gather
from flashlane.kernels.attention import triton_listed as listed
from flashlane.kernels.attention import triton_walk as walk
from flashlane.kernels.attention.kv8 import FP8
from flashlane.kernels.attention.triton_scores import index_scores  # the indexer
from flashlane.kernels.attention.triton_select import select_mask
from flashlane.kernels.attention.triton_walk import _block_update
from flashlane.kernels.pdl import enter, pdl
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

__all__ = ["CONFIGS", "attention", "index_scores", "select_mask"]

# attention tiles: BLOCK_M (token, head) rows x BLOCK_L keys, D up to 256, by dtype only
# (never by T, B or L): 16-bit on the tensor cores (wgmma), fp32 (tests) in exact dots. SKIP:
# a key block no row of the tile may see is not loaded (the loads then sit behind a branch and
# do not pipeline), the same bits. 16-bit prefill loads every block (8k: 10.6 -> 4.4 ms a
# layer on the H200, results/attention_prefill_h200_*.json); a call whose query fits one tile
# (a decode window) skips (`attention`).
SUPER = tl.constexpr(8)  # a skipping walk's span: SUPER blocks, one mask load (`attention`)
# split calls (decode and verify windows) through triton_gather.py, which reads only the allowed
# keys (16k-128k contexts: 38-63 us a layer against the split walk's 167-201 on the H200 at one
# stream, results/attention_decode_h200_a7f5aab.json); False (--kernels walk): the split walk
GATHER = True
CONFIGS = {
    # dtype: (BLOCK_M, BLOCK_L, num_warps, num_stages, dot input precision, SKIP)
    torch.bfloat16: (64, 32, 4, 2, "tf32", False),  # the precision only applies to fp32
    torch.float16: (64, 32, 4, 2, "tf32", False),
    torch.float32: (64, 32, 8, 1, "ieee", True),
}


@triton.jit(
    do_not_specialize=[
        "T",
        "L",
        "HQ",
        "HKV",
        "REP",
        "HAS_LEN",
        "HAS_TABLE",
        "HAS_POS",
        "split_keys",
    ]
)
def _attention_kernel(
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
    pm_ptr,
    pl_ptr,
    pa_ptr,
    HAS_LEN,
    HAS_TABLE,
    HAS_POS,
    T,
    L,
    HQ,
    HKV,
    REP,
    scale,
    split_keys,
    D: tl.constexpr,
    BD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_L: tl.constexpr,
    PRECISION: tl.constexpr,
    SKIP: tl.constexpr,
    FP8: tl.constexpr = False,
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

    # 64-bit scalar bases per (b, kv head), 32-bit offsets inside them (fewer live registers)
    q_ptr += i_b.to(tl.int64) * T * HQ * D
    o_ptr += i_b.to(tl.int64) * T * HQ * D
    mask_ptr += i_b.to(tl.int64) * T * L
    # batch b's keys and values: session b's caches (session_tables.attn_table) with a
    # table; runtime flags, so one compiled kernel serves every use
    k_off = i_b.to(tl.int64) * L * HKV * D
    v_off = k_off
    if HAS_TABLE != 0:
        k_off = tl.multiple_of(tl.load(tab_ptr + i_b * TABLE_WIDTH + K_COL), 16)
        v_off = tl.multiple_of(tl.load(tab_ptr + i_b * TABLE_WIDTH + V_COL), 16)
    k_ptr += k_off + i_kv * D
    v_ptr += v_off + i_kv * D
    # an 8-bit cache's fp32 scales [L, HKV]: batch b's, or session b's (the table's columns)
    ks_off = i_b.to(tl.int64) * L * HKV
    vs_off = ks_off
    if FP8:  # noqa: SIM102 (a constexpr, then a runtime flag: Triton compiles the first away)
        if HAS_TABLE != 0:
            ks_off = tl.load(tab_ptr + i_b * TABLE_WIDTH + KS_COL)
            vs_off = tl.load(tab_ptr + i_b * TABLE_WIDTH + VS_COL)
    ks_ptr += ks_off + i_kv
    vs_ptr += vs_off + i_kv
    q_row = (tok * HQ + head) * D  # [BLOCK_M]
    q = tl.load(q_ptr + q_row[:, None] + d[None, :], mask=m_rows[:, None] & m_d[None, :], other=0.0)
    mask_row = tok * L  # [BLOCK_M]
    # Keys at or past this sequence's length (when given) are read as if L ended there: a
    # runtime flag, not a constexpr, so both uses run one compiled kernel (same sums)
    n_keys = L
    if HAS_LEN != 0:
        n_keys = tl.minimum(tl.load(len_ptr + i_b).to(tl.int32), L)
    # With the rows' positions, the walk ends at the tile's last position: no row sees a
    # key past its own (the mask says so too), so the blocks beyond change no row's bits
    hi = n_keys
    if HAS_POS != 0:
        last = tl.load(pos_ptr + i_b.to(tl.int64) * T + tok, mask=m_rows, other=0)
        hi = tl.minimum(hi, tl.max(last.to(tl.int32)) + 1)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BD], dtype=tl.float32)
    # SKIP walks the keys SUPER blocks at a time, each span's mask read once: a span no row
    # may see costs one load, not SUPER (at a long context under QSA most spans are unseen);
    # the blocks taken are those of the plain walk, in its order (so the same bits)
    span = BLOCK_L * (SUPER if SKIP else 1)
    # a split call (triton_walk.py): this program walks keys [lo, lo + split_keys) only
    lo = tl.program_id(2) * split_keys
    hi = tl.minimum(hi, lo + split_keys)
    for s0 in range(lo, hi, span):
        seen = True
        if SKIP:  # the span's mask a block at a time (a whole span's bytes would spill)
            any_key = tl.zeros([BLOCK_M, BLOCK_L], dtype=tl.int32)
            for j in tl.static_range(SUPER):
                keys = s0 + j * BLOCK_L + tl.arange(0, BLOCK_L)
                part = tl.load(
                    mask_ptr + mask_row[:, None] + keys[None, :],
                    mask=m_rows[:, None] & (keys < n_keys)[None, :],
                    other=0,
                )
                any_key = tl.maximum(any_key, part.to(tl.int32))
            seen = tl.max(any_key) > 0
        if seen:
            for l0 in range(s0, tl.minimum(s0 + span, hi), BLOCK_L):
                m_i, l_i, acc = _block_update(
                    q,
                    k_ptr,
                    v_ptr,
                    mask_ptr,
                    mask_row,
                    m_rows,
                    m_d,
                    d,
                    l0,
                    n_keys,
                    scale,
                    m_i,
                    l_i,
                    acc,
                    HKV * D,
                    ks_ptr,
                    vs_ptr,
                    HKV,
                    BLOCK_L,
                    PRECISION,
                    SKIP,
                    FP8,
                )

    if tl.num_programs(2) > 1:  # a split's partial, for triton_walk.combine
        b_all = tl.num_programs(1) // HKV
        at = ((tl.program_id(2) * b_all + i_b) * T + tok).to(tl.int64) * HQ + head
        tl.store(pm_ptr + at, m_i, mask=m_rows)
        tl.store(pl_ptr + at, l_i, mask=m_rows)
        tl.store(pa_ptr + at[:, None] * D + d[None, :], acc, mask=m_rows[:, None] & m_d[None, :])
    else:
        seen = l_i > 0
        out = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], float("nan"))
        tl.store(
            o_ptr + q_row[:, None] + d[None, :],
            out.to(o_ptr.dtype.element_ty),
            mask=m_rows[:, None] & m_d[None, :],
        )


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    lengths: torch.Tensor | None = None,
    table: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    config: tuple | None = None,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    split: bool = False,
) -> torch.Tensor:
    """Masked softmax attention with grouped KV heads (fp32 scores and softmax).

    q: [B, T, Hq, D]; k, v: [B, L, Hkv, D]; mask: [B, T, L] bool -> [B, T, Hq, D] in q's dtype.
    q, k and v should share a dtype (k and v are read in theirs; q is cast to k's).
    `lengths` ([B] ints on the device): keys at or past lengths[b] are never read, exactly as
    if k and v ended there (the lone driver passes whole caches and the length on the device).
    `table` (session_tables.attn_table of B sessions' caches, with lengths): k and v are the first
    session's cache [1, L0, Hkv, D], batch b reads session b's in place, and mask is
    [B, T, L] for the longest cache; each row's sums are those of its session alone.
    `positions` ([B, T] on the device): row (b, t) sees no key past positions[b, t] (its mask
    says so as well); a tile's walk over the keys then ends at its last row's position
    instead of L, with the same bits. `config` replaces CONFIGS[dtype] (benchmarks).
    `scales` (k_scale, v_scale [B, L, Hkv] fp32; with a table the first session's): k and v
    are e4m3 (kv8.py), each key read as its value times its scale rounded to q's dtype, the
    values an 8-bit cache dequantizes to, so the sums are those of the dequantized cache.
    `split` (decode windows): the keys walked in ranges of SPLIT_KEYS by programs of their
    own and folded (triton_walk.py): other bits than a plain walk's past SPLIT_KEYS keys, the
    same whatever the batch.
    """
    if split and GATHER and config is None:
        if listed.LISTED:
            return listed.attention_listed(q, k, v, mask, scale, lengths, table, positions, scales)
        return gather.attention_gathered(q, k, v, mask, scale, lengths, table, positions, scales)
    b, t, hq, d = q.shape
    l, hkv = k.shape[1], k.shape[2]
    rep = hq // hkv
    out_dtype = q.dtype
    eight = scales is not None
    if eight and (k.dtype, v.dtype) != (FP8, FP8):
        raise ValueError(f"attention: scales for caches of {k.dtype} / {v.dtype}, not e4m3")
    if table is not None:
        if lengths is None or not (k.is_contiguous() and v.is_contiguous()):
            raise ValueError("attention: a table needs lengths and the caches themselves")
        if (k.dtype not in CONFIGS and not eight) or v.dtype != k.dtype:
            raise ValueError(f"attention: caches of {k.dtype} / {v.dtype}")
        l = mask.shape[-1]
    elif k.dtype not in CONFIGS and not eight:
        k = k.float()
    dtype = (q.dtype if q.dtype in CONFIGS else torch.float32) if eight else k.dtype
    block_m, block_l, warps, stages, precision, skip = config or CONFIGS[dtype]
    # a query that fits one tile (a decode window) skips the key blocks none of its rows may
    # see: the same bits (test_attention_positions_and_skip_keep_the_bits), and at a long
    # context the loads of the selected blocks only (a tenth of 16k keys under QSA's budget)
    skip = skip or (config is None and rep * t <= block_m)
    q = q.to(dtype).contiguous()
    k, v = k.contiguous(), v.to(k.dtype).contiguous()
    ks, vs = (t.contiguous() for t in scales) if eight else (no_scales(q.device),) * 2
    mask = mask.contiguous().view(torch.uint8)
    o = torch.empty(b, t, hq, d, dtype=out_dtype, device=q.device)
    if t == 0 or b == 0:
        return o
    if positions is not None:
        positions = positions.to(torch.long).expand(b, t).contiguous()
    splits = triton.cdiv(l, walk.SPLIT_KEYS) if split else 1
    parts = walk.partials(splits, b * t * hq, d, q.device) if splits > 1 else (ks,) * 3
    grid = (triton.cdiv(rep * t, block_m), b * hkv, splits)
    _attention_kernel[grid](
        q,
        k,
        v,
        mask,
        o,
        no_longs(q.device) if lengths is None else lengths,
        no_table(q.device) if table is None else table,
        no_longs(q.device) if positions is None else positions,
        ks,
        vs,
        *parts,
        int(lengths is not None),
        int(table is not None),
        int(positions is not None),
        t,
        l,
        hq,
        hkv,
        rep,
        float(scale),
        walk.SPLIT_KEYS if splits > 1 else 1 << 30,
        D=d,
        BD=triton.next_power_of_2(d),
        BLOCK_M=block_m,
        BLOCK_L=block_l,
        PRECISION=precision,
        SKIP=skip,
        FP8=eight,
        num_warps=warps,
        num_stages=stages,
        **pdl(q.device),
    )
    if splits == 1:
        return o
    return walk.combine(parts, o, walk.SPLIT_KEYS, l, lengths, positions)
