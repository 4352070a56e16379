"""The row-invariant linear's tiles (`kernels/linear/triton.py`): the K partitions of an
(N, K, dtype), which set a product's bits, and the tile shapes that follow the call's rows,
which do not (the H200 sweeps: results/tune_linears_h200.log, prefill_variants_h200_*.log).
"""

from __future__ import annotations

import functools

import torch

# programs to aim for in the split (few row tiles) variant: about two waves of 132 SMs
_TARGET_PROGRAMS = 264
# fewest K blocks in one partition (>= 2 also keeps every partition a real loop)
_MIN_BLOCKS_PER_PART = 2
# rows up to which a call takes the decode tile (tile_config), above it prefill_tile
DECODE_ROWS = 64
# rows up to which a decode tile runs on mma.sync rows of 16 whatever the weight's size:
# wgmma's rows of 64 computed 63 empty rows at one row (tune_linears_h200.log, 1 / 16 / 64
# rows: the output projections' 2560 x 6144 7.5 / 8.0 / 28.7 us on rows of 16 against
# 9.8 / 10.6 / 12.9 on rows of 64; 16480 x 2560 22.3 / 22.8 / 41.1 against 22.7 / 23.1 / 23.8)
FEW_ROWS = 16
# outputs up to this wide, split in six partitions or more, take decode tiles of 32 columns
_NARROW = 512
# and over this many K blocks or more, partitions of at least this many blocks
_LONG_K_BLOCKS, _LONG_K_PER_PART = 64, 4
# a prefill call whose 128 x 128 tiles would be fewer than this (and so split, kernels/linear/
# triton.py's _IN_PROGRAM_TILES) takes tiles of 64 x 64 instead (`_small_prefill_tile`)
FEW_PREFILL_TILES = 128


@functools.cache
def tile_config(n: int, k: int, dtype: torch.dtype) -> dict:
    """The decode tile of (N, K, dtype) and its K partitions (M never enters). bf16 / fp16:
    BLOCK_K 128, small weights (up to 4M values) on mma.sync rows of 16 (split-K carries
    them), larger ones on wgmma rows of 64, and partitions enough to fill about two waves
    of the SMs at one row (the H200 sweep's winners, results/tune_linears_h200.log)."""
    if dtype == torch.float32:
        # BLOCK_M 16: fp32 products run as FMAs on the CUDA cores (their order is k's, whatever
        # BLOCK_M), and a decode row (the router's) should not pay for 64
        # (one wave and 4 blocks a partition: 27 partitions of 3 timed slower than 16 of 5)
        bm, bn, bk, warps, stages = 16, 64, 32, 4, 2
        programs, fewest = _TARGET_PROGRAMS // 2, 2 * _MIN_BLOCKS_PER_PART
    else:
        bm, bn, bk, warps, stages = (16 if n * k <= 1 << 22 else 64), 64, 128, 4, 3
        programs, fewest = _TARGET_PROGRAMS, _MIN_BLOCKS_PER_PART
    n_tiles = -(-n // bn)
    k_blocks = -(-k // bk)
    parts = max(1, min(k_blocks // fewest, programs // n_tiles))
    per_part = -(-k_blocks // parts)
    parts = -(-k_blocks // per_part)  # no empty partition
    if dtype != torch.float32 and n <= _NARROW and parts >= 6:
        # narrow outputs over long K (the hyper-connections' 324 x 10240): columns of 32 in
        # the partitions made for 64 (cold_linears_h200_*.log: 8.2 -> 6.6 us a call cold)
        bn = 32
        if k_blocks >= _LONG_K_BLOCKS and per_part < _LONG_K_PER_PART:
            # and half as many partitions, twice as long: 24 chained reads took 14.4 us a
            # read against 16.3 (hc_read_chain_cfeb84c_h200.log); other bits than 40 of 2 blocks
            per_part = _LONG_K_PER_PART
            parts = -(-k_blocks // per_part)
    return dict(
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        PARTS=parts,
        BLOCKS_PER_PART=per_part,
        num_warps=warps,
        num_stages=stages,
    )


def row_tile(m: int, n: int, k: int, dtype: torch.dtype) -> dict:
    """The tile of a call of m rows: prefill_tile above DECODE_ROWS (`_small_prefill_tile`'s
    where its 128 x 128 tiles would be fewer than FEW_PREFILL_TILES), else tile_config's, in
    rows of FEW_ROWS up to FEW_ROWS rows. The shapes follow m; the partitions never do."""
    if m > DECODE_ROWS:
        t = prefill_tile(n, k, dtype)
        if t.get("FLAT") and -(-m // t["BLOCK_M"]) * -(-n // t["BLOCK_N"]) < FEW_PREFILL_TILES:
            return _small_prefill_tile(n, k, dtype)
        return t
    t = tile_config(n, k, dtype)
    return dict(t, BLOCK_M=FEW_ROWS) if m <= FEW_ROWS < t["BLOCK_M"] else t


@functools.cache
def prefill_tile(n: int, k: int, dtype: torch.dtype) -> dict:
    """The tile for more than DECODE_ROWS rows, with tile_config's partitions (the same spans
    of K). bf16 / fp16, by the H200 sweeps (results/prefill_variants_h200_*.log):
    * six partitions or more (short spans, long K for the width: the hyper-connections'
      324 x 10240, the router, 1281 x 2560, 2560 x 6144): 128 x 128 tiles in blocks of K of
      64 on 8 warps, 4 stages, all partitions in one pipelined loop that adds a partition's
      sum to the total in a branch at its last block (FLAT 2); at 8,192 rows 2560 x 6144
      took 492 us so against 737 in the 64 x 64 tiles of the select at every block (FLAT 1)
      and 581 in a pipeline a partition, 1281 x 2560 151 against 185, 324 x 10240 169
      against 188, the same bits (prefill_variants_fcde8a7_*.log);
    * else outputs narrower than 1024 keep the decode tile (10240 x 320: 36 us at 2,048 rows);
    * else 128 x 128 wgmma tiles on 8 warps in blocks of K of 64 (16480 x 2560: 254 us).
    fp32 products: rows of 64 (FMAs in one chain per output in k's order whatever BLOCK_M:
    tests/kernels/test_sm90_codegen.py reads the chain in the compiled code)."""
    t = tile_config(n, k, dtype)
    if dtype == torch.float32:
        return dict(t, BLOCK_M=64)
    span = t["BLOCK_K"] * t["BLOCKS_PER_PART"]
    flat = t["PARTS"] >= 6 and span % 64 == 0
    if not flat and n < 1024:
        return t
    wide = dict(
        t,
        BLOCK_M=128,
        BLOCK_N=128,
        BLOCK_K=64,
        BLOCKS_PER_PART=span // 64,
        num_warps=8,
        num_stages=4 if flat else 3,
    )
    return dict(wide, FLAT=2) if flat else wide


@functools.cache
def _small_prefill_tile(n: int, k: int, dtype: torch.dtype) -> dict:
    """prefill_tile's partitions in 64 x 64 tiles, blocks of K of 128 where a span holds them,
    on 4 warps: for calls with too few rows for 128 x 128 tiles to fill the SMs (the
    hyper-connections' 324 x 10240 at 2,048 rows: 48 tiles, which split their 20 partitions
    in 960 programs, 230 us a call in the 2k prefill's timeline). At 2,048 rows on the H200
    (results/prefill_variants_h200_af8bb74.log, all in one program, bits equal): 324 x 10240
    62.2 against 127.1 us in 128 x 128, 184.5 split; 1281 x 2560 49.5 against 68.2."""
    t = prefill_tile(n, k, dtype)
    span = t["BLOCK_K"] * t["BLOCKS_PER_PART"]
    bk = 128 if span % 128 == 0 else 64
    return dict(
        t, BLOCK_M=64, BLOCK_N=64, BLOCK_K=bk, BLOCKS_PER_PART=span // bk, num_warps=4, num_stages=3
    )


def shaped(y: torch.Tensor, lead: tuple[int, ...]) -> torch.Tensor:
    """A product y [M, N] (its rows perhaps padded past N) as [*lead, N], its row stride kept.
    torch's reshape gives a dim of size 1 a contiguous tensor's stride: one row of the
    router's aligned product (512 experts and the shared gate) came back with stride 513, two
    rows with 528, and a kernel specialised on its stride (16 divides it or not) compiled
    another variant for one row: the router's pick summed its softmax in another order."""
    if len(lead) == 1:
        return y
    if not lead:
        return y.reshape(y.shape[1])
    strides = [y.stride(0)]
    for size in reversed(lead[1:]):
        strides.insert(0, strides[0] * size)
    return y.as_strided((*lead, y.shape[1]), (*strides, 1))
