"""The block-FP8 GEMM's tiles and K partitions (kernels/linear/triton_fp8.py): the partitions
of a weight [N, K] for the rows' kind fix a product's bits (`fp8_parts` for prompt rows,
`decode_parts` for decode rows); the tile follows the rows' kind and count (`fp8_tile`,
kernels/row_kind.py)."""

from __future__ import annotations

import functools

from flashlane.kernels.linear.fp8 import BLOCK
from flashlane.kernels.linear.tiles import DECODE_ROWS

__all__ = [
    "DECODE_TILE_WIDE",
    "PROMPT_TILE",
    "PROMPT_TILE_WHOLE",
    "decode_parts",
    "fp8_parts",
    "fp8_tile",
]

# programs to aim for at one row (about two waves of the H200's 132 SMs), as tiles.py
_TARGET_PROGRAMS = 264
# fewest K blocks in a partition (>= 2 keeps every partition a real loop)
_MIN_BLOCKS_PER_PART = 2


@functools.cache
def fp8_parts(
    n: int, k: int, programs: int = _TARGET_PROGRAMS, block_n: int = 64
) -> tuple[int, int]:
    """(PARTS, BLOCKS_PER_PART) of an [N, K] FP8 weight: enough partitions to fill about
    `programs` (two waves) at one row in decode tiles of `block_n` columns, at least two K
    blocks each; N and K only (whatever the rows and x's dtype), so they fix a product's
    bits. Other programs / block_n: the tune script's candidates."""
    k_blocks = -(-k // BLOCK)
    n_tiles = -(-n // block_n)
    parts = max(1, min(k_blocks // _MIN_BLOCKS_PER_PART, programs // n_tiles))
    per_part = -(-k_blocks // parts)
    return -(-k_blocks // per_part), per_part  # no empty partition


@functools.cache
def decode_parts(n: int, k: int) -> tuple[tuple[int, int], bool]:
    """Decode rows' (PARTS, BLOCKS_PER_PART) of an [N, K] FP8 weight and whether the weight
    is wide: where decode tiles of 64 columns alone fill the target (one K partition: the
    in-projections, q, the n-gram keys), the partitions of tiles of 128 columns, run in
    DECODE_TILE_WIDE (2-3 partitions of 7-10 blocks: at one and 16 rows on the H100 the
    in-projection 21.6 -> 18.3 us, q 19.2 -> 16.6, the n-gram keys 18.0 -> 12.9;
    tune_fp8_decode_{f16,16rows}_h100_*). N and K only, so the same for every decode row
    whatever the call's rows; prompt rows keep `fp8_parts` (kernels/row_kind.py: the two kinds'
    bits may differ, each the same across its rows)."""
    parts = fp8_parts(n, k)
    if parts[0] > 1:
        return parts, False
    return fp8_parts(n, k, block_n=DECODE_TILE_WIDE["BLOCK_N"]), True


def fp8_tile(m: int, n: int, k: int, prompt: bool = False) -> dict:
    """The tile of a call of m rows: for decode rows 16 x 64 (DECODE_TILE) up to DECODE_ROWS
    rows (mma rows of 16: a decode step reads the weight once), 16 x 128 for a wide weight
    (DECODE_TILE_WIDE, `decode_parts`), 32 x 128 above DECODE_ROWS, never rows of 64: there
    Triton takes wgmma, whose per-block dot from zero differs from mma.sync's in a few
    elements of 10^5 on the H200 (benchmarks/fp8_bits_probe.py: 5 of 512,000 at 2560 x 2560
    on 64-row tiles, none on 16 or 32; fp8_bits_probe_h200_9dea15f). Prompt rows
    (kernels/row_kind.py): 64 x 128 on wgmma whatever m, on 8 warps (on 4 its sm_90 code
    spills: benchmarks/fp8_prefill_tiles.py), 128 x 128 on 8 warps where the weight has one
    K partition (PROMPT_TILE_WHOLE), with X_FP8: their activations in block FP8 too
    (kernels/linear/act_quant.py), the products on e4m3 tensor cores at twice bf16's rate.
    The partitions follow (N, K) and the rows' kind, never their count."""
    if prompt:
        parts, per_part = fp8_parts(n, k)
        shape = PROMPT_TILE if parts > 1 else PROMPT_TILE_WHOLE
        return dict(shape, BLOCK_K=BLOCK, PARTS=parts, BLOCKS_PER_PART=per_part)
    (parts, per_part), wide = decode_parts(n, k)
    if wide and m <= DECODE_ROWS:  # a program a partition where the tune timed it: one row tile
        shape = dict(DECODE_TILE_WIDE, SPLIT=m <= DECODE_TILE_WIDE["BLOCK_M"])
    elif m <= DECODE_ROWS:
        shape = DECODE_TILE
    else:
        shape = dict(BLOCK_M=32, BLOCK_N=128, num_warps=4, num_stages=3)
    return dict(shape, BLOCK_K=BLOCK, PARTS=parts, BLOCKS_PER_PART=per_part)


# decode rows' tile up to DECODE_ROWS (fp8_tile) and that of a wide weight's (decode_parts):
# 128 columns on 4 warps, 5 stages, the tune's best or within 2% of it on the H100 for the
# three wide products; in one row tile fp8_tile splits it a program a partition (SPLIT, as
# the tune timed it at 1 and 16 rows: one program running both of the in-projection's 128
# tiles would fill under one wave; above, linear_fp8's rule)
DECODE_TILE = dict(BLOCK_M=16, BLOCK_N=64, num_warps=4, num_stages=4)
DECODE_TILE_WIDE = dict(BLOCK_M=16, BLOCK_N=128, num_warps=4, num_stages=5)
# prompt rows' tile (fp8_tile): their activations in block FP8 too (act_quant), the products
# on e4m3 tensor cores
PROMPT_TILE = dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=3, X_FP8=True)
# ... and where the weight's K is one partition (most of the wide in-projections): a tile of
# 128 x 128 rows by columns, 4 stages, 4-11% faster at 8k rows on the H200 with the same bits
# (prompt rows' bits follow the partitions alone; fp8_prompt_rows_ae0ff91_20261205T052513Z);
# with several partitions its sm_90 code spills
PROMPT_TILE_WHOLE = dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=4, X_FP8=True)
