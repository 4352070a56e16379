"""The attention kernel's walk over the keys (triton.py) and its split over key ranges.

_block_update: one key block of a tile's online softmax. A decode window's walk may be split
(`attention(..., split=True)`): program s of a tile walks keys [s*SPLIT_KEYS, (s+1)*SPLIT_KEYS)
from a fresh state and stores its partial (m, l, acc); `combine` folds the partials of each
row in split order (`_merge`) and divides. A row's result is a function of its own row, mask
and keys alone: the ranges are fixed key positions (never chosen by T, B or L), a range past
the row's last key leaves a partial (-inf, 0, 0) that `combine` does not fold (a row folds
the ranges below its own last key, however many the batch's longest cache makes), and a
first range folds into the empty state exactly; a call of one range writes as the plain walk
does (the same bits). Why: one program per (tile, b, kv head) walked a decode row's 16k keys
alone, two programs on the GPU for Flash Next at one stream.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.tables import no_longs

SPLIT_KEYS = 2048  # keys a split program walks (a multiple of the walk's span, 256)


@triton.jit
def _block_update(
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
    stride_kv,
    ks_ptr,
    vs_ptr,
    stride_s,
    BLOCK_L: tl.constexpr,
    PRECISION: tl.constexpr,
    SKIP: tl.constexpr,
    FP8: tl.constexpr,
):
    """One key block [l0, l0 + BLOCK_L) of the online softmax for the tile's rows. With SKIP a
    block no row of the tile may see is not loaded; without it every block is (the loads
    then pipeline). Either way a row's state is bitwise the same: a block it may not see
    gives it p = 0 and alpha = 1 (or keeps m = -inf, l = 0, acc = 0)."""
    keys = l0 + tl.arange(0, BLOCK_L)
    m_keys = keys < n_keys
    allowed = (
        tl.load(
            mask_ptr + mask_row[:, None] + keys[None, :],
            mask=m_rows[:, None] & m_keys[None, :],
            other=0,
        )
        != 0
    )
    go = True
    if SKIP:
        go = tl.max(allowed.to(tl.int32)) > 0
    if go:
        kv_row = keys * stride_kv  # [BLOCK_L]
        m_kd = m_keys[:, None] & m_d[None, :]
        k = tl.load(k_ptr + kv_row[:, None] + d[None, :], mask=m_kd, other=0.0)
        if FP8:  # e4m3 times its row's scale in fp32, rounded to the compute dtype (kv8.py)
            ks = tl.load(ks_ptr + keys * stride_s, mask=m_keys, other=0.0)
            k = (k.to(tl.float32) * ks[:, None]).to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # a row that has seen no allowed key keeps m = -inf: subtract 0 instead, so that
        # exp(-inf - -inf) never makes NaN (p = 0 and alpha = 0 on its zero state)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + kv_row[:, None] + d[None, :], mask=m_kd, other=0.0)
        if FP8:
            vs = tl.load(vs_ptr + keys * stride_s, mask=m_keys, other=0.0)
            v = (v.to(tl.float32) * vs[:, None]).to(q.dtype)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _merge(m, l, acc, ms, ls, accs):
    """Fold a range's partial (ms, ls, accs) into the running (m, l, acc), as the online
    softmax folds a block: exact for an empty partial or an empty running state."""
    m_new = tl.maximum(m, ms)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    a = tl.exp(m - m_safe)
    b = tl.exp(ms - m_safe)
    return m_new, l * a + ls * b, acc * a[:, None] + accs * b[:, None]


@triton.jit
def _partial(m_ptr, l_ptr, acc_ptr, at, inside, m_rd, d, D: tl.constexpr):
    """The partials (m, l, acc) at rows `at` where `inside`, empty elsewhere."""
    m = tl.load(m_ptr + at, mask=inside, other=float("-inf"))
    l = tl.load(l_ptr + at, mask=inside, other=0.0)
    acc_at = acc_ptr + at[:, None].to(tl.int64) * D + d[None, :]
    return m, l, tl.load(acc_at, mask=inside[:, None] & m_rd, other=0.0)


@triton.jit(do_not_specialize=["rows", "S", "T", "L", "HQ", "RANGE", "HAS_LEN", "HAS_POS"])
def _combine_kernel(
    m_ptr,
    l_ptr,
    acc_ptr,
    o_ptr,
    len_ptr,
    pos_ptr,
    HAS_LEN,
    HAS_POS,
    rows,
    S,
    T,
    L,
    HQ,
    RANGE,
    D: tl.constexpr,
    BD: tl.constexpr,
    ROWS: tl.constexpr,
):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    m_r = r < rows
    d = tl.arange(0, BD)
    m_rd = m_r[:, None] & (d < D)[None, :]
    # a row folds the ranges below its own last key only (those past it hold (-inf, 0, 0)):
    # its keys end at L, its session's length and its position, as the programs' did
    bt = r // HQ
    n = tl.full([ROWS], L, dtype=tl.int32)
    if HAS_LEN != 0:
        n = tl.minimum(n, tl.load(len_ptr + bt // T, mask=m_r, other=0).to(tl.int32))
    if HAS_POS != 0:
        n = tl.minimum(n, tl.load(pos_ptr + bt, mask=m_r, other=-1).to(tl.int32) + 1)
    mine = tl.minimum((tl.maximum(n, 0) + RANGE - 1) // RANGE, S)
    m_i = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, BD], dtype=tl.float32)
    # two ranges a step, both loaded before either folds (the folds stay in range order)
    for s in range(0, tl.max(tl.where(m_r, mine, 0)), 2):
        at = s * rows + r
        a_in = m_r & (s < mine)
        b_in = m_r & (s + 1 < mine)
        ma, la, acca = _partial(m_ptr, l_ptr, acc_ptr, at, a_in, m_rd, d, D)
        mb, lb, accb = _partial(m_ptr, l_ptr, acc_ptr, at + rows, b_in, m_rd, d, D)
        m_a, l_a, acc_a = _merge(m_i, l_i, acc, ma, la, acca)
        m_i = tl.where(a_in, m_a, m_i)
        l_i = tl.where(a_in, l_a, l_i)
        acc = tl.where(a_in[:, None], acc_a, acc)
        m_b, l_b, acc_b = _merge(m_i, l_i, acc, mb, lb, accb)
        m_i = tl.where(b_in, m_b, m_i)
        l_i = tl.where(b_in, l_b, l_i)
        acc = tl.where(b_in[:, None], acc_b, acc)
    seen = l_i > 0
    out = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], float("nan"))
    o = out.to(o_ptr.dtype.element_ty)
    tl.store(o_ptr + r[:, None].to(tl.int64) * D + d[None, :], o, mask=m_rd)


def partials(splits: int, rows: int, d: int, device) -> tuple[torch.Tensor, ...]:
    """The split programs' partials: m, l [splits, rows] and acc [splits, rows, d], fp32."""
    m = torch.empty(splits, rows, dtype=torch.float32, device=device)
    return m, torch.empty_like(m), torch.empty(splits, rows, d, dtype=torch.float32, device=device)


def combine(
    parts: tuple[torch.Tensor, ...],
    o: torch.Tensor,
    keys_a_range: int,
    num_keys: int,
    lengths: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """o [B, T, Hq, D]: each row's partials folded in range order, then divided. A row folds
    only the ranges of `keys_a_range` keys below its last key (num_keys, its session's
    `lengths` [B], its `positions` [B, T] + 1, as the range programs read them): the others
    hold empty partials, whose fold is exact, so the same bits, without a walk over the
    empty ranges of a large session (33 of them at 67k positions and a short context)."""
    m, l, acc = parts
    t, hq, d = o.shape[1:]
    rows = m.shape[1]
    block = 8
    _combine_kernel[(triton.cdiv(rows, block),)](
        m,
        l,
        acc,
        o,
        no_longs(o.device) if lengths is None else lengths,
        no_longs(o.device) if positions is None else positions,
        int(lengths is not None),
        int(positions is not None),
        rows,
        m.shape[0],
        t,
        num_keys,
        hq,
        keys_a_range,
        D=d,
        BD=triton.next_power_of_2(d),
        ROWS=block,
    )
    return o
