"""The indexer's mask for long rows, spread over programs (triton_select.SPREAD).

At a 128k context a row has 32k complete blocks, and triton_select's one program a row reads
them six times and writes 128k mask bytes alone: 300 us a layer on the H200 at one stream
(benchmarks/attention_decode.py, 8c6b3cc). Here the same ranking runs over programs of CHUNK
blocks each (those inside the row's complete blocks), five launches a step. Pass 0: each
program's NaN count and top byte's 256-bin histogram, in slots of its own (no counters to zero
first; a row of at most WHOLE blocks is ranked whole by its first program, in registers).
Passes 1-3: each lower byte's histogram over the keys that share the bytes found so far,
added atomically (every program derives those bytes from the histograms before it). Pass 4:
the kept flags, the keys above the threshold (their count from the histograms) and of its
ties (their count: the last histogram's) the lowest ids; a program counts the ties before it
only when some are dropped. Counts are integers, so the same on any device and in any order:
the kept blocks, and the mask, are the one-program ranking's bit for bit. Pass 4 also writes
the mask of its blocks' keys, for every row (the last program's reach the end of the keys).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.attention.triton_select import (
    _keep_whole,
    _mask_keys,
    _order_key,
    _pick_digit,
    whole_warps,
)

MASK_KEYS = 1024  # mask bytes the last pass writes a step
TOP_KEY = tl.constexpr(4294967296)  # a NaN's order key
ROW = tl.constexpr(1025)  # a row's counters: bytes 1-3's histograms (atomic), then the sums
TOTAL = tl.constexpr(768)  # ... the top byte's histogram summed over the programs, the NaNs
SLOTS = tl.constexpr(16)  # programs' slots summed a step


@triton.jit
def _top_counts(hist_row, nans_row, firsts_row, n_act, p, PASS: tl.constexpr):
    """The row's NaN count and its top byte's 256-bin histogram. Pass 0 writes each
    program's in slots of its own (no atomics, so nothing to zero before it); pass 1 sums
    the slots of the `n_act` programs inside the row, its first program keeps the sums for
    the passes after."""
    bins = tl.arange(0, 256)
    if PASS == 1:
        s = tl.arange(0, SLOTS)
        nans = tl.full([], 0, dtype=tl.int64)
        hist = tl.zeros([256], dtype=tl.int64)
        for s0 in range(0, n_act, SLOTS):
            m = s0 + s < n_act
            nans += tl.sum(tl.load(nans_row + s0 + s, mask=m, other=0).to(tl.int64), axis=0)
            slot = firsts_row + (s0 + s)[:, None] * 256 + bins[None, :]
            hist += tl.sum(tl.load(slot, mask=m[:, None], other=0).to(tl.int64), axis=0)
        if p == 0:
            tl.store(hist_row + TOTAL + bins, hist.to(tl.int32))
            tl.store(hist_row + TOTAL + 256, nans.to(tl.int32))
    else:
        hist = tl.load(hist_row + TOTAL + bins).to(tl.int64)
        nans = tl.load(hist_row + TOTAL + 256).to(tl.int64)
    return nans, hist


@triton.jit
def _found(hist_row, first, nans, UPTO: tl.constexpr, TOP: tl.constexpr):
    """The threshold's bytes from the top down to byte UPTO (excluded), from the top byte's
    histogram `first` and the lower bytes' added atomically at `hist_row` by the passes
    before -> (prefix, keys above every candidate with that prefix)."""
    above = nans
    prefix = nans * 0
    if UPTO > 0:
        above, prefix = _pick_digit(first, above, prefix, 24, TOP)
    for j in tl.static_range(1, 4):
        if j < UPTO:
            hist = tl.load(hist_row + (j - 1) * 256 + tl.arange(0, 256)).to(tl.int64)
            above, prefix = _pick_digit(hist, above, prefix, 24 - 8 * j, TOP)
    return prefix, above


@triton.jit(do_not_specialize=["nb", "num_keys"])
def _spread_kernel(
    scores_ptr,
    pos_ptr,
    nans_ptr,
    firsts_ptr,
    hist_ptr,
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
    hist_row = hist_ptr + row * ROW
    nans_row = nans_ptr + row * n_p
    firsts_row = firsts_ptr + row * n_p * 256
    n_act = tl.cdiv(complete, CHUNK)  # programs inside the row's complete blocks
    if PASS == 0:  # noqa: SIM102 (Triton: a constexpr apart from a tensor's test)
        if p == 0:  # the lower bytes' counters, for the atomics of passes 1-3
            for j in tl.static_range(3):
                tl.store(hist_row + j * 256 + tl.arange(0, 256), 0)
            if (complete > TOP) & (complete <= WHOLE):  # a short row: ranked in registers
                _keep_whole(scores_ptr + row * nb, keep_ptr + row * nb, complete, pos * 0,
                            TOP, WHOLE)  # fmt: skip
    if (complete > TOP) & (complete > WHOLE) & (p < n_act):
        ids = p * CHUNK + tl.arange(0, CHUNK)
        ok = ids < complete
        key = _order_key(tl.load(scores_ptr + row * nb + ids, mask=ok, other=0.0))
        if PASS == 0:  # this program's NaNs and top byte's histogram, in its own slots
            tl.store(nans_row + p, tl.sum((ok & (key == TOP_KEY)).to(tl.int32), axis=0))
            digit = ((key >> 24) & 255).to(tl.int32)
            first = tl.histogram(digit, 256, mask=ok & (key < TOP_KEY))
            tl.store(firsts_row + p * 256 + tl.arange(0, 256), first)
        elif PASS < 4:  # byte PASS's histogram over the keys with the bytes found above it
            shift = 24 - 8 * PASS
            nans, first = _top_counts(hist_row, nans_row, firsts_row, n_act, p, PASS)
            prefix, _ = _found(hist_row, first, nans, PASS, TOP)
            same = ok & (key < TOP_KEY) & ((key >> (shift + 8)) == (prefix >> (shift + 8)))
            digit = ((key >> shift) & 255).to(tl.int32)
            hist = tl.histogram(digit, 256, mask=same)
            tl.atomic_add(hist_row + (PASS - 1) * 256 + tl.arange(0, 256), hist)
        else:  # the kept flags: the keys above the threshold, and of its ties the lowest ids
            nans, first = _top_counts(hist_row, nans_row, firsts_row, n_act, p, PASS)
            thresh = nans * 0 + TOP_KEY
            above = nans * 0
            ties = nans  # keys equal to the threshold in the whole row
            if nans < TOP:
                thresh, above = _found(hist_row, first, nans, 4, TOP)
                ties = tl.load(hist_row + 2 * 256 + (thresh & 255)).to(tl.int64)
            need = TOP - above
            tie = ok & (key == thresh)
            seen = nans * 0  # ties in the programs before: counted only when some are dropped
            if ties > need:  # (a program with ties is inside the row)
                for c0 in range(0, p * CHUNK, 4 * CHUNK):
                    at = c0 + tl.arange(0, 4 * CHUNK)
                    s = tl.load(scores_ptr + row * nb + at, mask=at < p * CHUNK, other=0.0)
                    tied = (at < p * CHUNK) & (_order_key(s) == thresh)
                    seen += tl.sum(tied.to(tl.int64), axis=0)
            rank = seen + tl.cumsum(tie.to(tl.int64), axis=0)  # 1-based among the ties
            keep = ok & ((key > thresh) | (tie & (rank <= need)))
            tl.store(keep_ptr + row * nb + ids, keep.to(tl.int8), mask=ok)
    if PASS == 4:  # the mask of this program's blocks' keys from their flags
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


def rank_and_mask(scores, positions, mask, sizes: tuple[int, int, int, int]):
    """mask [rows, num_keys] int8 of every row, its kept blocks ranked by programs of `chunk`
    blocks (a row of at most `whole` complete blocks by one, in registers). scores [rows, NB]
    fp32, positions [rows]; sizes: (block, top, chunk, whole)."""
    block, top, chunk, whole = sizes
    rows, nb = scores.shape
    num_keys = mask.shape[1]
    if rows == 0 or nb == 0 or num_keys == 0:
        raise ValueError(f"rank_and_mask: {rows} rows, {nb} blocks, {num_keys} keys")
    n_p = triton.cdiv(nb, chunk)
    dev = scores.device
    keep = torch.empty(rows, nb, dtype=torch.int8, device=dev)
    nans = torch.empty(rows, n_p, dtype=torch.int32, device=dev)
    firsts = torch.empty(rows, n_p, 256, dtype=torch.int32, device=dev)
    hist = torch.empty(rows, ROW, dtype=torch.int32, device=dev)
    for step in range(5):
        _spread_kernel[(rows, n_p)](
            scores, positions, nans, firsts, hist, keep, mask, nb, num_keys,
            BLOCK=block, TOP=top, CHUNK=chunk, WHOLE=whole, PASS=step, KEYS=MASK_KEYS,
            num_warps=whole_warps(whole),
        )  # fmt: skip
