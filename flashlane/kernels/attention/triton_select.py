"""The indexer's key mask in Triton, in one launch (reference.select_mask's top blocks
without a sort); its scores: triton_scores.py.

One program per query row. Its complete blocks are those whose last position is <= the
row's position; it keeps the `top_blocks` of them with the highest scores, ties to the lower
block id, exactly as reference.select_mask's stable descending sort ranks them (NaN above
everything, -0.0 equal to +0.0). The K-th highest score is found over an order-preserving
integer key of the fp32 score, a byte at a time from the top: a 256-bin histogram of the keys
that share the bytes found so far (a row of up to WHOLE blocks from its scores in registers,
a longer one in five reads of them, a sixth for the flags); the blocks above it are kept,
and of those equal to it the lowest ids, up to K.
Then each key gets `position >= key and (key past the complete blocks or its block kept)`.
A row's mask is a function of its own scores and position alone (row invariance).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.attention.triton_scores import index_scores
from flashlane.kernels.pdl import enter, pdl

# the mask's loops over a row's blocks and keys, CHUNK at a time
CHUNK = 1024
# a row of up to WHOLE complete blocks is ranked from one load of its scores, in registers
# (an 8k-token prompt's rows have up to 2,048: 661 us a layer on the H200 reloading them in
# every pass); longer rows take the loops over chunks. The same kept blocks either way. 4,096
# (16k keys): the decode select 24.5-26.4 us a layer at 16k against 26.7-29.9 at 2,048, and
# 25.3 / 26.1 / 33.5 against 28.5 / 29.9 / 33.3 at 64k, 1 / 4 / 16 streams; 8,192 slower
# (results/attention_decode_h200_fa9ace7.json)
WHOLE = 4096
# rows past WHOLE blocks ranked by programs of CHUNK blocks each, which then write the mask
# (triton_select_spread.py, five launches: the same mask; 32-40 us a layer at 16k-64k on the
# H200 against one program's 55-144, results/attention_decode_h200_a41687c.json, when it took
# seven); False (--kernels walk): one program a row
SPREAD = True
# ... for masks of more than SPREAD_KEYS keys (sessions that large): up to 16k keys one program
# a row is as fast (37 against 33 us a layer at 16k, at ten launches) in one launch
SPREAD_KEYS = 16384
# ... in calls of fewer than SPREAD_ROWS rows: a prompt piece's thousands of rows fill the GPU
# one program a row, which ranks up to ROWS_WHOLE blocks in registers. H100, 32,768 prompt
# rows (`attention_prefill.py --select-only`, results/attention_prefill_select_h100_f52e301_*):
# spread 13.17 ms a layer, one program a row 9.42, up to 8,192 blocks whole 8.98; one mask.
# Up to the row's blocks only (`rows_whole`): at 8,192 rows (2,048 blocks) ranking in 8,192
# registers took 1.58 ms a layer against 0.96 in 4,096 (results/attention_prefill_gathered_
# 8192_h100_0fb7b54_*)
SPREAD_ROWS, ROWS_WHOLE = 4096, 8192


def rows_whole(rows: int, nb: int) -> int:
    """The blocks a select program of a call of `rows` rows over `nb` blocks ranks in
    registers: WHOLE, or for a prompt piece its blocks' power of two up to ROWS_WHOLE."""
    if rows < SPREAD_ROWS:
        return WHOLE
    return min(ROWS_WHOLE, max(WHOLE, triton.next_power_of_2(max(nb, 1))))


def whole_warps(whole: int) -> int:
    """Warps for a program that ranks up to `whole` blocks in registers: 16 keys a thread."""
    return min(16, max(4, whole // 512))


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
def _mask_keys(
    keys, pos, reach, complete, keep_row, mask_row, nb, num_keys, BLOCK: tl.constexpr,
    TOP: tl.constexpr,
):  # fmt: skip
    """The mask of `keys`: causal, and inside the complete blocks only the kept ones (a block
    past the block keys reads the last one's flag, as the reference's clamped gather does)."""
    inside = keys < num_keys
    allowed = keys <= pos
    if complete > TOP:
        in_complete = keys // BLOCK < reach
        blk = tl.minimum(keys // BLOCK, nb - 1)
        kept = tl.load(keep_row + blk, mask=inside & in_complete, other=0)
        allowed = allowed & ((~in_complete) | (kept != 0))
    tl.store(mask_row + keys, allowed.to(tl.int8), mask=inside)


@triton.jit
def _pick_digit(hist, above, prefix, shift, TOP: tl.constexpr):
    """One byte of the TOP-th highest key from its 256-bin histogram over the keys that share
    the higher bytes found so far (`prefix`; `above`: the keys above every one of them) ->
    (above, prefix) with the byte at `shift` found."""
    bins = tl.arange(0, 256)
    at_least = above + (tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist)
    digit = tl.max(tl.where(at_least >= TOP, bins, -1), axis=0)
    above += tl.sum(tl.where(bins > digit, hist, 0), axis=0)
    return above, prefix | (digit.to(tl.int64) << shift)


@triton.jit
def _keep_whole(base, keep_row, complete, zero, TOP: tl.constexpr, WHOLE: tl.constexpr):
    """The kept flags of a row's `complete` (<= WHOLE) blocks: the ranking of the loops
    below (the same threshold byte by byte, the same ties), its scores loaded once and every
    histogram taken from registers."""
    ids = tl.arange(0, WHOLE)
    ok = ids < complete
    key = _order_key(tl.load(base + ids, mask=ok, other=0.0))
    top = zero + 4294967296
    nans = tl.sum((ok & (key == top)).to(tl.int64), axis=0)
    thresh = top
    above = zero  # keys above the threshold: none above a NaN's key
    if nans < TOP:
        above = nans
        prefix = zero
        for b in tl.static_range(4):
            shift = 24 - 8 * b
            same = ok & (key < top) & ((key >> (shift + 8)) == (prefix >> (shift + 8)))
            digit = ((key >> shift) & 255).to(tl.int32)
            hist = tl.histogram(digit, 256, mask=same)
            above, prefix = _pick_digit(hist, above, prefix, shift, TOP)
        thresh = prefix
    need = TOP - above
    tie = ok & (key == thresh)
    rank = tl.cumsum(tie.to(tl.int64), axis=0)  # 1-based among the ties
    keep = ok & ((key > thresh) | (tie & (rank <= need)))
    tl.store(keep_row + ids, keep.to(tl.int8), mask=ok)


@triton.jit
def _radix_threshold(base, complete, zero, TOP: tl.constexpr, CHUNK: tl.constexpr):
    """The TOP-th highest order key of a row's `complete` scores (what `_keep_whole` finds
    in registers) and the count of keys above it, in five reads of the row: the NaNs (key
    2^32) first, then the low 32 bits a byte at a time from the top, each byte's 256-bin
    histogram over the keys that share the bytes found so far. Integer counts: the same key
    on any device."""
    top = zero + 4294967296
    nans = zero
    for start in range(0, complete, CHUNK):
        ids = start + tl.arange(0, CHUNK)
        ok = ids < complete
        key = _order_key(tl.load(base + ids, mask=ok, other=0.0))
        nans += tl.sum((ok & (key == top)).to(tl.int64), axis=0)
    thresh = top
    above = zero  # none above a NaN's key
    if nans < TOP:
        above = nans  # keys above every candidate so far: NaNs, then higher prefixes
        prefix = zero
        for b in range(4):
            shift = 24 - 8 * b
            hist = tl.zeros([256], dtype=tl.int32)
            for start in range(0, complete, CHUNK):
                ids = start + tl.arange(0, CHUNK)
                ok = ids < complete
                key = _order_key(tl.load(base + ids, mask=ok, other=0.0))
                same = ok & (key < top) & ((key >> (shift + 8)) == (prefix >> (shift + 8)))
                digit = ((key >> shift) & 255).to(tl.int32)
                hist += tl.histogram(digit, 256, mask=same)
            above, prefix = _pick_digit(hist, above, prefix, shift, TOP)
        thresh = prefix
    return thresh, above


@triton.jit(do_not_specialize=["nb", "num_keys"])
def _select_kernel(
    scores_ptr,
    pos_ptr,
    keep_ptr,
    mask_ptr,
    nb,
    num_keys,
    BLOCK: tl.constexpr,
    TOP: tl.constexpr,
    CHUNK: tl.constexpr,
    WHOLE: tl.constexpr,
    PDL: tl.constexpr = 0,
):
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
        thresh, above = _radix_threshold(base, complete, zero, TOP, CHUNK)
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
    for start in range(0, num_keys, CHUNK):
        keys = start + tl.arange(0, CHUNK)
        mask_row = mask_ptr + row * num_keys
        _mask_keys(keys, pos, reach, complete, keep_ptr + row * nb, mask_row, nb, num_keys,
                   BLOCK, TOP)  # fmt: skip


def select_from_scores(
    scores: torch.Tensor, positions: torch.Tensor, num_keys: int, block: int, top_blocks: int
) -> torch.Tensor:
    """scores [B, T, NB] fp32 (the indexer's, for the cache's NB blocks), positions [B, T]
    -> bool mask [B, T, num_keys], as reference.select_mask."""
    b, t, nb = scores.shape
    rows = b * t
    mask = torch.empty((b, t, num_keys), dtype=torch.int8, device=scores.device)
    if not rows or not num_keys:
        return mask.view(torch.bool)
    whole = rows_whole(rows, nb)
    if SPREAD and num_keys > SPREAD_KEYS and nb > 0 and rows < SPREAD_ROWS:  # one mask anyway
        from flashlane.kernels.attention import triton_select_spread as spread

        flat, pos = scores.reshape(rows, nb).contiguous(), positions.contiguous().view(rows)
        spread.rank_and_mask(
            flat, pos, mask.view(rows, num_keys), (block, top_blocks, CHUNK, WHOLE)
        )
        return mask.view(torch.bool)
    keep = torch.empty((rows, max(nb, 1)), dtype=torch.int8, device=scores.device)
    _select_kernel[(rows,)](
        scores.contiguous(),
        positions.contiguous(),
        keep,
        mask,
        nb,
        num_keys,
        BLOCK=block,
        TOP=top_blocks,
        CHUNK=CHUNK,
        WHOLE=whole,
        num_warps=whole_warps(whole),
        **pdl(mask.device),
    )
    return mask.view(torch.bool)


def select_mask(
    index_q: torch.Tensor,
    block_keys: torch.Tensor,
    positions: torch.Tensor,
    num_keys: int,
    block: int,
    top_blocks: int,
    dense_check: bool = True,
    decode: bool = False,
) -> torch.Tensor:
    """reference.select_mask: the indexer scores and the mask each in one Triton launch
    (the mask ranked without a sort), always without the dense shortcut (the same
    mask): its host read of a device value waits for the GPU, which costs a host-bound round
    more than the scores do. `dense_check` is accepted for the signature and ignored.
    `decode`: the rows are decode rows (verify windows), whose scores take their own tile
    (triton_scores.py)."""
    scores = index_scores(index_q, block_keys, positions=positions, block=block, decode=decode)
    return select_from_scores(scores, positions, num_keys, block, top_blocks)
