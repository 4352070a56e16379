"""The indexer's scores in Triton: sum_h relu(q_h . block key) / sqrt(Di) for every query
row and block key, as reference.index_scores. One program per tile of query rows and block
keys sums the heads in order; the tile never depends on T, B or the number of block keys, so
a row's scores are its own bits.

Prompt rows take each head's scores as a dot on the tensor cores, 64 query rows a tile.
Decode rows (a verify window's, a lone or drafted step's: `decode`) come one or a few to a
session, so a 64-row dot spent 63 of its 64 rows on nothing: at 131,072 keys the scores took
37 us a layer at four streams, the tensor cores' time, with the keys read at 0.86 TB/s
(results/attention_decode_71c8965_*.json); one row a program on the FMA units took twice
that (results/attention_decode_h100_46374c1_*.json). So decode rows turn the dot around: the
block keys are its 64 rows and up to 16 query rows its columns, a quarter of the work. The two
kinds' bits differ (DESIGN.md section 1 allows it: kernels/row_kind.py), and each kind has one
tile whatever else runs.
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
# decode rows' tiles: (query rows, block keys, warps), each head's scores a dot of the block
# keys (the MMA's 64-row side) by the few query rows (16 columns, the least a dot takes). On
# the H100 at 131,072 keys and 1 / 4 / 16 streams: 6.7 / 18.0 / 70.0 us a layer against the
# prompt tile's 11.1 / 33.7 / 127.3, the same bits (results/decode_scores_h100_1ea81b8_*);
# (16, 128, 8) in 3 stages was 1.6-8 us faster at 128k but 0.7 slower at 16k and one stream
DECODE_TILE = (16, 64, 4)
# tile programs a launch aims at: 0, one a tile (a 71,808-position session: 281 a row, most of
# them past a short context's blocks); N, each program loops over every (N / rows)-th tile of
# its row, the same sums. 528 (four an SM): a QSA layer 0.3-14 us faster at 64 to 64k keys,
# the most at 16 streams (results/attention_decode_h200_8299589.json)
PROGRAMS = 528
# decode rows' programs (eight an SM): at 131,072 keys and four streams 18.0 us against 18.8
DECODE_PROGRAMS = 1056


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
    DECODE: tl.constexpr = False,
    PDL: tl.constexpr = 0,
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    i_b = tl.program_id(2)
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # this program's query rows
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
    if HAS_POS != 0:  # tiles past every row's complete blocks: never ranked, not computed
        p = tl.load(pos_ptr + i_b.to(tl.int64) * T + t, mask=m_t, other=-1)
        nb = tl.minimum(nb, tl.max((p + 1) // BLOCK, axis=0))
    q_rows = (i_b.to(tl.int64) * T + t) * HI * DI  # [BLOCK_T]
    q_ptrs, m_q = iq_ptr + q_rows[:, None] + d[None, :], m_t[:, None] & m_d[None, :]
    out_rows = (i_b.to(tl.int64) * T + t) * NB
    # this program's tiles of block keys: one, or every num_programs(1)-th (the same sums)
    for tile in range(tl.program_id(1), tl.cdiv(nb, BLOCK_N).to(tl.int32), tl.num_programs(1)):
        n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        m_n = n < nb
        key = tl.load(
            keys_ptr + n[:, None].to(tl.int64) * DI + d[None, :],
            mask=m_n[:, None] & m_d[None, :],
            other=0.0,
        )
        # decode rows: the block keys as the dot's rows, the few query rows as its columns
        if DECODE:
            acc = tl.zeros([BLOCK_N, BLOCK_T], dtype=tl.float32)
        else:
            acc = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
        for h in range(0, HI):
            qh = tl.load(q_ptrs + h * DI, mask=m_q, other=0.0).to(key.dtype)
            if DECODE:
                acc += tl.maximum(tl.dot(key, tl.trans(qh), input_precision=PRECISION), 0.0)
            else:
                acc += tl.maximum(tl.dot(qh, tl.trans(key), input_precision=PRECISION), 0.0)
        if DECODE:
            out, m_out = out_rows[None, :] + n[:, None], m_n[:, None] & m_t[None, :]
        else:
            out, m_out = out_rows[:, None] + n[None, :], m_t[:, None] & m_n[None, :]
        tl.store(scores_ptr + out, acc / sqrt_di, mask=m_out)


def index_scores(
    index_q: torch.Tensor,
    block_keys: torch.Tensor,
    table: torch.Tensor | None = None,
    nb: int = 0,
    positions: torch.Tensor | None = None,
    block: int = 0,
    decode: bool = False,
) -> torch.Tensor:
    """sum_h relu(index_q[b, t, h] . block_keys[b, n]) / sqrt(Di) in fp32: [B, T, NB]. One
    program per tile of query rows and block keys (INDEX_TILE; fewer with PROGRAMS, each
    looping over tiles), each head's scores a
    tensor-core dot: a decode row over a long cache is spread over the SMs (one program
    walking 2,112 block keys took 50 us on the H200), the tile never depends on T, and each
    score is summed over the heads in order whatever the grid. With `table`
    (session_tables.attn_table): block_keys is the first session's [NB0, Di], batch b scores session
    b's in place, and the scores have nb columns, those past session b's own left unwritten.
    With `positions` [B, T] and the indexer's `block`, columns at or past a row's complete
    blocks ((position + 1) // block, the most the mask ranks) may be left unwritten: a tile
    past all its rows' is not computed (a short context in a large session). `decode`: the
    rows are decode rows (module docstring): the block keys are the dot's rows."""
    b, t, hi, di = index_q.shape
    if positions is not None and block <= 0:
        raise ValueError("index_scores: positions need the indexer's block")
    if table is None:
        nb = block_keys.shape[1]
    scores = torch.empty(b, t, nb, dtype=torch.float32, device=index_q.device)
    if b * t == 0 or nb == 0:
        return scores
    block_t, block_n, warps, *stages = DECODE_TILE if decode else INDEX_TILE
    programs = DECODE_PROGRAMS if decode else PROGRAMS
    keys = block_keys.contiguous()
    tiles = triton.cdiv(nb, block_n)
    if programs > 0:
        tiles = max(1, min(tiles, programs // (b * triton.cdiv(t, block_t))))
    _index_scores_kernel[(triton.cdiv(t, block_t), tiles, b)](
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
        DECODE=decode,
        num_warps=warps,
        **({"num_stages": stages[0]} if stages else {}),
        **pdl(scores.device),
    )
    return scores
