"""The indexer's mask for long rows, spread over programs (triton_select.SPREAD).

At a 128k context a row has 32k complete blocks, and triton_select's one program a row reads
them seven times and writes 128k mask bytes alone: 300 us a layer on the H200 at one stream
(benchmarks/attention_decode.py, 8c6b3cc). Here the same ranking runs over programs of CHUNK
blocks each, one launch a step: the NaN count and the top byte's 256-bin histogram, then each
lower byte's histogram over the keys that share the bytes found so far (every program derives
those bytes from the histograms before it), then each program's counts above and at the
threshold, then the kept flags (ties to the lowest ids: a program knows the ties of the
programs before it). Counts are integers added atomically, so the same on any device and in
any order: the kept blocks, and the mask, are the one-program ranking's bit for bit. The last
pass also writes the mask of its blocks' keys, for every row (the last program's reach the
end of the keys); triton_select's launch before zeroed the counters: seven launches with it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.attention.triton_select import HIST, _mask_keys, _order_key

MASK_KEYS = 1024  # mask bytes the last pass writes a step
TOP_KEY = tl.constexpr(4294967296)  # a NaN's order key


@triton.jit
def _found(hist_row, nans, UPTO: tl.constexpr, TOP: tl.constexpr):
    """The threshold's bytes from the top down to byte UPTO (excluded), from the histograms
    of the passes before -> (prefix, keys above every candidate with that prefix)."""
    bins = tl.arange(0, 256)
    above = nans
    prefix = nans * 0
    for j in tl.static_range(4):
        if j < UPTO:
            hist = tl.load(hist_row + j * 256 + bins).to(tl.int64)
            at_least = above + (tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist)
            digit = tl.max(tl.where(at_least >= TOP, bins, -1), axis=0)
            above += tl.sum(tl.where(bins > digit, hist, 0), axis=0)
            prefix = prefix | (digit.to(tl.int64) << (24 - 8 * j))
    return prefix, above


@triton.jit(do_not_specialize=["nb", "num_keys"])
def _spread_kernel(
    scores_ptr,
    pos_ptr,
    hist_ptr,
    nans_ptr,
    slots_ptr,
    keep_ptr,
    mask_ptr,
    nb,
    num_keys,
    BLOCK: tl.constexpr,
    TOP: tl.constexpr,
    CHUNK: tl.constexpr,
    WHOLE: tl.constexpr,
    PASS: tl.constexpr,
    KEYS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    n_p = tl.num_programs(1)
    pos = tl.load(pos_ptr + row).to(tl.int64)
    complete = tl.minimum((pos + 1) // BLOCK, nb).to(tl.int32)
    if (complete > TOP) & (complete > WHOLE):  # else triton_select's one program ranked it
        ids = p * CHUNK + tl.arange(0, CHUNK)
        ok = ids < complete
        key = _order_key(tl.load(scores_ptr + row * nb + ids, mask=ok, other=0.0))
        hist_row = hist_ptr + row * HIST
        if PASS == 0:
            tl.atomic_add(nans_ptr + row, tl.sum((ok & (key == TOP_KEY)).to(tl.int32), axis=0))
        if PASS < 4:  # byte PASS's histogram (unused past the NaNs when they fill TOP)
            shift = 24 - 8 * PASS
            nans = tl.load(nans_ptr + row).to(tl.int64)  # complete from pass 1 on
            prefix, _ = _found(hist_row, nans, PASS, TOP)
            same = ok & (key < TOP_KEY) & ((key >> (shift + 8)) == (prefix >> (shift + 8)))
            digit = ((key >> shift) & 255).to(tl.int32)
            hist = tl.histogram(digit, 256, mask=same)
            tl.atomic_add(hist_row + PASS * 256 + tl.arange(0, 256), hist)
        else:
            nans = tl.load(nans_ptr + row).to(tl.int64)
            thresh = nans * 0 + TOP_KEY
            if nans < TOP:
                thresh, _ = _found(hist_row, nans, 4, TOP)
            tie = ok & (key == thresh)
            slots = slots_ptr + row * 2 * n_p
            if PASS == 4:  # this program's counts above and at the threshold
                tl.store(slots + p, tl.sum((ok & (key > thresh)).to(tl.int32), axis=0))
                tl.store(slots + n_p + p, tl.sum(tie.to(tl.int32), axis=0))
            else:  # the kept flags: the ties of lower ids first, up to the count left
                above = nans * 0
                seen = nans * 0
                for s0 in range(0, n_p, 1024):
                    s = s0 + tl.arange(0, 1024)
                    a = tl.load(slots + s, mask=s < n_p, other=0).to(tl.int64)
                    t = tl.load(slots + n_p + s, mask=s < p, other=0).to(tl.int64)
                    above += tl.sum(a, axis=0)
                    seen += tl.sum(t, axis=0)
                rank = seen + tl.cumsum(tie.to(tl.int64), axis=0)  # 1-based among the ties
                keep = ok & ((key > thresh) | (tie & (rank <= TOP - above)))
                tl.store(keep_ptr + row * nb + ids, keep.to(tl.int8), mask=ok)
    if PASS == 5:  # the mask of this program's blocks' keys from their flags
        tl.debug_barrier()  # the flags' stores before their loads, across the program's threads
        lo = p * CHUNK * BLOCK
        hi = tl.minimum(lo + CHUNK * BLOCK, num_keys)
        if p == n_p - 1:
            hi = num_keys
        reach = (pos + 1) // BLOCK
        for start in range(lo, hi, KEYS):
            keys = start + tl.arange(0, KEYS)
            _mask_keys(keys, pos, reach, complete, keep_ptr + row * nb,
                       mask_ptr + row * num_keys, nb, num_keys, BLOCK, TOP)  # fmt: skip


def rank_and_mask(scores, positions, keep, counters, mask, sizes: tuple[int, int, int, int]):
    """keep [rows, NB] int8: the kept flags of the rows past `whole` complete blocks (and
    past `top`), ranked by programs of `chunk` blocks; then mask [rows, num_keys] int8 of
    every row. scores [rows, NB] fp32, positions [rows]; counters: (hist [rows, HIST], nans
    [rows]) int32, zeroed by triton_select's launch before; sizes: (block, top, chunk,
    whole)."""
    block, top, chunk, whole = sizes
    rows, nb = scores.shape
    num_keys = mask.shape[1]
    if rows == 0 or nb == 0 or num_keys == 0:
        raise ValueError(f"rank_and_mask: {rows} rows, {nb} blocks, {num_keys} keys")
    n_p = triton.cdiv(nb, chunk)
    slots = torch.empty(rows, 2, n_p, dtype=torch.int32, device=scores.device)
    for step in range(6):
        _spread_kernel[(rows, n_p)](
            scores, positions, *counters, slots, keep, mask, nb, num_keys,
            BLOCK=block, TOP=top, CHUNK=chunk, WHOLE=whole, PASS=step, KEYS=MASK_KEYS,
        )  # fmt: skip
