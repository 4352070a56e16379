"""Prompt rows far into their context read only their allowed keys (issue 29's long prompts).

Under QSA a row at position p sees at most top_blocks x block keys (2,048, plus its incomplete
block's) of its p + 1. The walk (triton.py) shares each key block's loads among a tile's
rows (about five tokens of 12 heads) but loads every block up to the tile's last position,
so its cost a row grows with p: an 8k prompt's attention took 4.4 ms a layer on the H200, a
32k one's rows walk four times as far. Rows at or past FAR_ROWS take this kernel instead:
one program per (row, kv head) lists its allowed positions a CHUNK of mask bytes at a time
(triton_gather._list), gathers BLOCK_L listed keys a step into its online softmax
(triton_gather._fold) and stores the row; the walk leaves out the tiles whose rows are all
that far (`far`, its runtime bound).

Bits: a far row's result is a function of its own mask, keys and position alone (chunks at
fixed key positions from 0, steps fixed indices of a chunk's list), so the same whatever the
piece, the batch and the neighbours; they are not the walk's bits (another grouping of the
same keys), and a row's position alone picks its kernel, so every call gives a row the same.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.attention import triton_gather as gather
from flashlane.kernels.tables import no_longs, no_scales, no_table

# prompt rows at or past this position take the far kernel (read only their allowed keys)
FAR_ROWS = 8192
CHUNK = 1024  # mask bytes (key positions) a listing step reads and a fold then walks
BLOCK_L = 32  # listed keys a step gathers
OFF = 1 << 30  # `far` for a walk with no far call after it


@triton.jit(do_not_specialize=["T", "L", "HKV", "stride_b", "HAS_LEN", "HAS_TABLE", "far"])
def _far_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, o_ptr, len_ptr, tab_ptr, pos_ptr, ks_ptr, vs_ptr,
    list_ptr, HAS_LEN, HAS_TABLE, T, L, HKV, stride_b, scale, far,
    HQ: tl.constexpr, REP: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_L: tl.constexpr, CHUNK: tl.constexpr,
    PRECISION: tl.constexpr, FP8: tl.constexpr,
):  # fmt: skip
    i_bt = tl.program_id(0)  # (batch, token)
    i_kv = tl.program_id(1)
    if tl.load(pos_ptr + i_bt) >= far:
        i_b = i_bt // T
        q, head, m_r = gather._group_q(q_ptr, i_bt, i_kv, HQ, REP, D, BD, BLOCK_M)
        bases = gather._bases(
            k_ptr, v_ptr, ks_ptr, vs_ptr, tab_ptr, i_b, i_kv, stride_b, HKV, HAS_TABLE, D, FP8
        )
        n_keys = gather._n_keys(len_ptr, pos_ptr, i_b, i_bt, L, HAS_LEN, 1)
        mine = list_ptr + (i_bt * HKV + i_kv).to(tl.int64) * CHUNK
        mask_row = mask_ptr + i_bt.to(tl.int64) * L
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BD], dtype=tl.float32)
        for c0 in range(0, n_keys, CHUNK):
            count = gather._list(mask_row, c0, tl.minimum(c0 + CHUNK, n_keys), mine, c0, CHUNK)
            tl.debug_barrier()  # the list's stores before its loads, across the threads
            for j0 in range(0, count, BLOCK_L):
                j = j0 + tl.arange(0, BLOCK_L)
                m_j = j < count
                keys = c0 + tl.load(mine + j, mask=m_j, other=0).to(tl.int32)
                k, v = gather._kv_loads(keys, m_j, bases, HKV, q.dtype, D, BD, FP8)
                m_i, l_i, acc = gather._fold(q, k, v, m_j, m_i, l_i, acc, scale, PRECISION)
            tl.debug_barrier()  # every load of this list before the next chunk's stores
        d = tl.arange(0, BD)
        seen = l_i > 0
        out = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], float("nan"))
        q_row = (i_bt.to(tl.int64) * HQ + head) * D
        tl.store(
            o_ptr + q_row[:, None] + d[None, :],
            out.to(o_ptr.dtype.element_ty),
            mask=m_r[:, None] & (d < D)[None, :],
        )


def far_from(positions: torch.Tensor | None, split: bool, keys: int) -> int:
    """The walk's `far`: FAR_ROWS where a far call follows it (prompt rows with positions,
    keys past FAR_ROWS: a row at position p has p + 1 keys, so with fewer none is far), else
    OFF. The rows a call leaves out and the rows it gives the far kernel are the same."""
    return FAR_ROWS if positions is not None and not split and keys > FAR_ROWS else OFF


def attend_far(q, k, v, mask, o, scale, lengths, table, positions, scales, stride_b: int):
    """Rows of o ([B, T, Hq, D]) at positions >= FAR_ROWS from their allowed keys alone: the
    walk's arguments as triton.attention made them (q in the compute dtype, the mask's
    bytes [B, T, L], positions [B, T] longs, contiguous)."""
    b, t, hq, d = q.shape
    hkv = k.shape[2]
    lists = torch.empty(b * t * hkv * CHUNK, dtype=torch.int16, device=q.device)
    eight = scales is not None
    ks, vs = scales if eight else (no_scales(q.device),) * 2
    _far_kernel[(b * t, hkv)](
        q, k, v, mask, o,
        no_longs(q.device) if lengths is None else lengths,
        no_table(q.device) if table is None else table,
        positions, ks, vs, lists,
        int(lengths is not None), int(table is not None),
        t, mask.shape[-1], hkv, stride_b, float(scale), FAR_ROWS,
        HQ=hq, REP=hq // hkv, D=d, BD=triton.next_power_of_2(d),
        BLOCK_M=max(16, triton.next_power_of_2(hq // hkv)), BLOCK_L=BLOCK_L, CHUNK=CHUNK,
        PRECISION=gather.PRECISION[q.dtype], FP8=eight, num_warps=4,
    )  # fmt: skip
