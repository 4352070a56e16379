"""The indexer in Triton: its scores on the tensor cores, and its key mask in one launch
(reference.select_mask's top blocks without a sort).

index_scores: one program per tile of query rows and block keys that sums relu(q_h . key)
over the indexer heads in order, each head's scores a dot.

The mask: one program per query row. Its complete blocks are those whose last position is <= the
row's position; it keeps the `top_blocks` of them with the highest scores, ties to the lower
block id, exactly as reference.select_mask's stable descending sort ranks them (NaN above
everything, -0.0 equal to +0.0). The K-th highest score is found by a bitwise binary search
over an order-preserving integer key of the fp32 score (33 counting passes over the row's
blocks; a row past WHOLE blocks: a 256-bin histogram a byte, five reads of its scores); the
blocks above it are kept, and of those equal to it the lowest ids, up to K.
Then each key gets `position >= key and (key past the complete blocks or its block kept)`.
A row's mask is a function of its own scores and position alone (row invariance).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.pdl import enter, pdl
from flashlane.kernels.tables import BLOCKS_COL, NB_COL, TABLE_WIDTH, no_longs, no_table

# the indexer on the tensor cores: tiles of INDEX_TILE = (query rows, block keys, warps); each
# head's scores a dot (16-bit products exact in fp32, summed by the MMA), relu'd and added in
# head order (an 8k prompt: 1.59 -> 0.11 ms a layer on the H200 against fp32 FMAs one row a
# program, the same mask; results/attention_prefill_h200_0e77c8b.json)
INDEX_TILE = (64, 64, 4)
# the mask's loops over a row's blocks and keys, CHUNK at a time
CHUNK = 1024
# a row of up to WHOLE complete blocks is ranked from one load of its scores, in registers
# (an 8k-token prompt's rows have up to 2,048: 661 us a layer on the H200 reloading them in
# every pass); longer rows take the loops over chunks. The same kept blocks either way.
WHOLE = 2048
# rows past WHOLE blocks ranked by programs of CHUNK blocks each, which then write the mask
# (triton_select_spread.py: the same mask; 33-51 us a layer at 16k-128k on the H200 against
# one program's 37-272 at cfbca59, in ten launches, now seven); False (--kernels walk): one
# program a row
SPREAD = True
# ... for masks of more than SPREAD_KEYS keys (sessions that large): up to 16k keys one program
# a row is as fast (37 against 33 us a layer at 16k) in one launch where the spread takes seven
SPREAD_KEYS = 16384


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


@triton.jit
def _radix_threshold(base, complete, zero, TOP: tl.constexpr, CHUNK: tl.constexpr):
    """The TOP-th highest order key of a row's `complete` scores (what the binary search of
    `_keep_whole` finds), in five reads of the row instead of 33: the NaNs (key 2^32) first,
    then the low 32 bits a byte at a time from the top, each byte's 256-bin histogram over
    the keys that share the bytes found so far. Integer counts: the same key on any device."""
    top = zero + 4294967296
    nans = zero
    for start in range(0, complete, CHUNK):
        ids = start + tl.arange(0, CHUNK)
        ok = ids < complete
        key = _order_key(tl.load(base + ids, mask=ok, other=0.0))
        nans += tl.sum((ok & (key == top)).to(tl.int64), axis=0)
    thresh = top
    if nans < TOP:
        above = nans  # keys above every candidate so far: NaNs, then higher prefixes
        prefix = zero
        bins = tl.arange(0, 256)
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
            at_least = above + (tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist)
            digit_k = tl.max(tl.where(at_least >= TOP, bins, -1), axis=0)
            above += tl.sum(tl.where(bins > digit_k, hist, 0), axis=0)
            prefix = prefix | (digit_k.to(tl.int64) << shift)
        thresh = prefix
    return thresh


@triton.jit(do_not_specialize=["nb", "num_keys"])
def _select_kernel(
    scores_ptr,
    pos_ptr,
    keep_ptr,
    mask_ptr,
    hist_ptr,
    nans_ptr,
    nb,
    num_keys,
    BLOCK: tl.constexpr,
    TOP: tl.constexpr,
    CHUNK: tl.constexpr,
    WHOLE: tl.constexpr,
    LONG: tl.constexpr = True,
    MASK: tl.constexpr = True,
    PDL: tl.constexpr = 0,
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    row = tl.program_id(0).to(tl.int64)
    if not MASK:  # the spread ranking's counters of this row, zeroed for its first pass
        tl.store(hist_ptr + row * 1024 + tl.arange(0, 1024), 0)
        tl.store(nans_ptr + row, 0)
    pos = tl.load(pos_ptr + row).to(tl.int64)
    zero = pos * 0
    reach = (pos + 1) // BLOCK  # the blocks complete at this position
    complete = tl.minimum(reach, nb).to(tl.int32)  # ... that have a block key: the ranked
    base = scores_ptr + row * nb
    if (complete > TOP) & (complete <= WHOLE):
        _keep_whole(base, keep_ptr + row * nb, complete, zero, TOP, WHOLE)
    elif complete > TOP:  # noqa: SIM102 (Triton: a constexpr apart from a tensor's test)
        if LONG:  # (else triton_select_spread ranks the row)
            thresh = _radix_threshold(base, complete, zero, TOP, CHUNK)
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
    for start in range(0, num_keys if MASK else 0, CHUNK):  # (else the spread's last pass)
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
    keep = torch.empty((max(rows, 1), max(nb, 1)), dtype=torch.int8, device=scores.device)
    spread = SPREAD and num_keys > SPREAD_KEYS and nb > 0  # the same mask either way
    hist = torch.empty(
        (max(rows, 1), 4, 256) if spread else 1, dtype=torch.int32, device=keep.device
    )
    nans = torch.empty(max(rows, 1) if spread else 1, dtype=torch.int32, device=keep.device)
    if rows and num_keys:
        _select_kernel[(rows,)](
            scores.contiguous(),
            positions.contiguous(),
            keep,
            mask,
            hist,
            nans,
            nb,
            num_keys,
            BLOCK=block,
            TOP=top_blocks,
            CHUNK=CHUNK,
            WHOLE=WHOLE,
            LONG=not spread,
            MASK=not spread,
            **pdl(mask.device),
        )
        if spread:
            from flashlane.kernels.attention import triton_select_spread as spread

            flat, pos = scores.reshape(rows, nb).contiguous(), positions.contiguous().view(rows)
            sizes = (block, top_blocks, CHUNK, WHOLE)
            spread.rank_and_mask(flat, pos, keep, (hist, nans), mask.view(rows, num_keys), sizes)
    return mask.view(torch.bool)


@triton.jit(do_not_specialize=["T", "NB", "HI", "HAS_TABLE", "HAS_POS", "BLOCK"])
def _index_scores_kernel(
    iq_ptr,
    keys_ptr,
    scores_ptr,
    tab_ptr,
    pos_ptr,
    HAS_TABLE,
    HAS_POS,
    T,
    NB,
    HI,
    BLOCK,
    sqrt_di,
    DI: tl.constexpr,
    BDI: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    i_b = tl.program_id(2)
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # this program's query rows
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # ... and block keys
    d = tl.arange(0, BDI)
    m_d = d < DI
    m_t = t < T
    # with a table: session b's block keys and its own count of them (NB: the scores' row)
    off = i_b.to(tl.int64) * NB * DI
    nb = NB.to(tl.int64)
    if HAS_TABLE != 0:
        off = tl.multiple_of(tl.load(tab_ptr + i_b * TABLE_WIDTH + BLOCKS_COL), 16)
        nb = tl.load(tab_ptr + i_b * TABLE_WIDTH + NB_COL)
    keys_ptr += off
    m_n = n < nb
    heads = HI
    if HAS_POS != 0:  # a tile past every row's complete blocks: never ranked, not computed
        p = tl.load(pos_ptr + i_b.to(tl.int64) * T + t, mask=m_t, other=-1)
        reach = tl.max((p + 1) // BLOCK, axis=0)
        m_n = m_n & (n < reach)
        heads = tl.where(tl.program_id(1) * BLOCK_N < reach, HI, 0)
    key = tl.load(
        keys_ptr + n[:, None].to(tl.int64) * DI + d[None, :],
        mask=m_n[:, None] & m_d[None, :],
        other=0.0,
    )
    q_rows = (i_b.to(tl.int64) * T + t) * HI * DI  # [BLOCK_T]
    acc = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
    for h in range(0, heads):
        qh = tl.load(
            iq_ptr + q_rows[:, None] + h * DI + d[None, :],
            mask=m_t[:, None] & m_d[None, :],
            other=0.0,
        ).to(key.dtype)
        s = tl.dot(qh, tl.trans(key), input_precision=PRECISION)
        acc += tl.maximum(s, 0.0)
    out = scores_ptr + (i_b.to(tl.int64) * T + t)[:, None] * NB + n[None, :]
    tl.store(out, acc / sqrt_di, mask=m_t[:, None] & m_n[None, :])


def index_scores(
    index_q: torch.Tensor,
    block_keys: torch.Tensor,
    table: torch.Tensor | None = None,
    nb: int = 0,
    positions: torch.Tensor | None = None,
    block: int = 0,
) -> torch.Tensor:
    """sum_h relu(index_q[b, t, h] . block_keys[b, n]) / sqrt(Di) in fp32: [B, T, NB]. One
    program per tile of query rows and block keys (INDEX_TILE), each head's scores a
    tensor-core dot: a decode row over a long cache is spread over the SMs (one program
    walking 2,112 block keys took 50 us on the H200), the tile never depends on T, and each
    score is summed over the heads in order whatever the grid. With `table`
    (session_tables.attn_table): block_keys is the first session's [NB0, Di], batch b scores session
    b's in place, and the scores have nb columns, those past session b's own left unwritten.
    With `positions` [B, T] and the indexer's `block`, columns at or past a row's complete
    blocks ((position + 1) // block, the most the mask ranks) may be left unwritten: a tile
    past all its rows' is not computed (a short context in a large session)."""
    b, t, hi, di = index_q.shape
    if positions is not None and block <= 0:
        raise ValueError("index_scores: positions need the indexer's block")
    if table is None:
        nb = block_keys.shape[1]
    scores = torch.empty(b, t, nb, dtype=torch.float32, device=index_q.device)
    if b * t == 0 or nb == 0:
        return scores
    block_t, block_n, warps = INDEX_TILE
    keys = block_keys.contiguous()
    _index_scores_kernel[(triton.cdiv(t, block_t), triton.cdiv(nb, block_n), b)](
        index_q.to(keys.dtype).contiguous(),
        keys,
        scores,
        no_table(index_q.device) if table is None else table,
        no_longs(index_q.device)
        if positions is None
        else positions.to(torch.long).expand(b, t).contiguous(),
        int(table is not None),
        int(positions is not None),
        t,
        nb,
        hi,
        max(block, 1),
        float(di**0.5),
        DI=di,
        BDI=triton.next_power_of_2(di),
        BLOCK_T=block_t,
        BLOCK_N=block_n,
        PRECISION="ieee" if keys.dtype == torch.float32 else "tf32",
        num_warps=warps,
        **pdl(scores.device),
    )
    return scores


def select_mask(
    index_q: torch.Tensor,
    block_keys: torch.Tensor,
    positions: torch.Tensor,
    num_keys: int,
    block: int,
    top_blocks: int,
    dense_check: bool = True,
) -> torch.Tensor:
    """reference.select_mask: the indexer scores and the mask each in one Triton launch
    (the mask ranked without a sort), always without the dense shortcut (the same
    mask): its host read of a device value waits for the GPU, which costs a host-bound round
    more than the scores do. `dense_check` is accepted for the signature and ignored."""
    scores = index_scores(index_q, block_keys, positions=positions, block=block)
    return select_from_scores(scores, positions, num_keys, block, top_blocks)
