"""The indexer's key mask in one launch: reference.select_mask's top blocks without a sort.

One program per query row. Its complete blocks are those whose last position is <= the
row's position; it keeps the `top_blocks` of them with the highest scores, ties to the lower
block id, exactly as reference.select_mask's stable descending sort ranks them (NaN above
everything, -0.0 equal to +0.0). The K-th highest score is found by a bitwise binary search
over an order-preserving integer key of the fp32 score (33 counting passes over the row's
blocks); the blocks above it are kept, and of those equal to it the lowest ids, up to K.
Then each key gets `position >= key and (key past the complete blocks or its block kept)`.
A row's mask is a function of its own scores and position alone (row invariance).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.pdl import enter, pdl

CHUNK = 1024
# a row of up to WHOLE complete blocks is ranked from one load of its scores, in registers
# (an 8k-token prompt's rows have up to 2,048: 661 us a layer on the H200 reloading them in
# every pass); longer rows take the loops over chunks. The same kept blocks either way.
WHOLE = 2048


@triton.jit
def _order_key(s):
    """fp32 scores -> int64 keys in the order of a descending sort's ranking: NaN highest,
    -0.0 equal to +0.0."""
    bits = s.to(tl.int32, bitcast=True)
    mag = (bits & 0x7FFFFFFF).to(tl.int64)
    key = tl.where(bits >= 0, mag + 2147483648, 2147483647 - mag)
    key = tl.where(mag == 0, 2147483648, key)
    return tl.where(s != s, 4294967296, key)


@triton.jit
def _keep_whole(base, keep_row, complete, zero, TOP: tl.constexpr, WHOLE: tl.constexpr):
    """The kept flags of a row's `complete` (<= WHOLE) blocks: the ranking of the loops
    below, its scores loaded once."""
    ids = tl.arange(0, WHOLE)
    ok = ids < complete
    key = _order_key(tl.load(base + ids, mask=ok, other=0.0))
    thresh = zero
    for i in range(33):
        cand = thresh | ((zero + 1) << (zero + 32 - i))  # int64 on both sides
        if tl.sum((ok & (key >= cand)).to(tl.int64), axis=0) >= TOP:
            thresh = cand
    need = TOP - tl.sum((ok & (key > thresh)).to(tl.int64), axis=0)
    tie = ok & (key == thresh)
    rank = tl.cumsum(tie.to(tl.int64), axis=0)  # 1-based among the ties
    keep = ok & ((key > thresh) | (tie & (rank <= need)))
    tl.store(keep_row + ids, keep.to(tl.int8), mask=ok)


@triton.jit(do_not_specialize=["nb", "num_keys"])
def _select_kernel(scores_ptr, pos_ptr, keep_ptr, mask_ptr, nb, num_keys,
                   BLOCK: tl.constexpr, TOP: tl.constexpr, CHUNK: tl.constexpr,
                   WHOLE: tl.constexpr, PDL: tl.constexpr = 0):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    row = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + row).to(tl.int64)
    zero = pos * 0
    reach = (pos + 1) // BLOCK  # the blocks complete at this position
    complete = tl.minimum(reach, nb).to(tl.int32)  # ... that have a block key: the ranked
    base = scores_ptr + row * nb
    if (complete > TOP) & (complete <= WHOLE):
        _keep_whole(base, keep_ptr + row * nb, complete, zero, TOP, WHOLE)
    elif complete > TOP:
        # the TOP-th highest key among them, bit by bit from the top
        thresh = zero
        for i in range(33):
            cand = thresh | ((zero + 1) << (zero + 32 - i))  # int64 on both sides
            count = zero
            for start in range(0, complete, CHUNK):
                ids = start + tl.arange(0, CHUNK)
                ok = ids < complete
                key = _order_key(tl.load(base + ids, mask=ok, other=0.0))
                count += tl.sum((ok & (key >= cand)).to(tl.int64), axis=0)
            if count >= TOP:
                thresh = cand
        above = zero
        for start in range(0, complete, CHUNK):
            ids = start + tl.arange(0, CHUNK)
            ok = ids < complete
            key = _order_key(tl.load(base + ids, mask=ok, other=0.0))
            above += tl.sum((ok & (key > thresh)).to(tl.int64), axis=0)
        need = TOP - above  # blocks tied at the threshold to keep, lowest ids first
        seen = zero
        for start in range(0, complete, CHUNK):
            ids = start + tl.arange(0, CHUNK)
            ok = ids < complete
            key = _order_key(tl.load(base + ids, mask=ok, other=0.0))
            tie = ok & (key == thresh)
            rank = seen + tl.cumsum(tie.to(tl.int64), axis=0)  # 1-based among the ties
            keep = ok & ((key > thresh) | (tie & (rank <= need)))
            tl.store(keep_ptr + row * nb + ids, keep.to(tl.int8), mask=ok)
            seen += tl.sum(tie.to(tl.int64), axis=0)
    # each key: causal, and inside the complete blocks only the kept ones (a block past the
    # block keys reads the last one's flag, as the reference's clamped gather does)
    for start in range(0, num_keys, CHUNK):
        keys = start + tl.arange(0, CHUNK)
        inside = keys < num_keys
        allowed = keys <= pos
        if complete > TOP:
            in_complete = keys // BLOCK < reach
            blk = tl.minimum(keys // BLOCK, nb - 1)
            kept = tl.load(keep_ptr + row * nb + blk, mask=inside & in_complete, other=0)
            allowed = allowed & ((~in_complete) | (kept != 0))
        tl.store(mask_ptr + row * num_keys + keys, allowed.to(tl.int8), mask=inside)


def select_from_scores(scores: torch.Tensor, positions: torch.Tensor, num_keys: int,
                       block: int, top_blocks: int) -> torch.Tensor:
    """scores [B, T, NB] fp32 (the indexer's, for the cache's NB blocks), positions [B, T]
    -> bool mask [B, T, num_keys], as reference.select_mask."""
    b, t, nb = scores.shape
    rows = b * t
    mask = torch.empty((b, t, num_keys), dtype=torch.int8, device=scores.device)
    keep = torch.empty((max(rows, 1), max(nb, 1)), dtype=torch.int8, device=scores.device)
    if rows and num_keys:
        _select_kernel[(rows,)](
            scores.contiguous(), positions.contiguous(), keep, mask, nb, num_keys,
            BLOCK=block, TOP=top_blocks, CHUNK=CHUNK, WHOLE=WHOLE, **pdl(mask.device),
        )
    return mask.view(torch.bool)
