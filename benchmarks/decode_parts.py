"""The small decode products' K partitions (issue 9): for each narrow or small bf16 product
of a flashnext-12l decode step (hyper-connection down, shared expert in and down, router, PLE
value), today's decode tile against narrower columns (BLOCK_N 16 / 32 / 64) and partitions
for one, two or four waves of the SMs. Partitions set the bits (a product's sums follow its
spans of K), so a winner changes every row's bits the same way everywhere: no row depends on
its batch, but the new bits are new. The calls at one and four rows are timed in one CUDA
graph (`bench_linears.timed`). GPU only; prints a table and one JSON line.

    python benchmarks/decode_parts.py
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_linears import timed
from flashlane.kernels.linear import triton as tlin

SMS = 132
# (N, K, calls a token): the products whose time is furthest above their bytes' at one row
SHAPES = [
    (324, 10240, 24),
    (1281, 2560, 12),
    (2560, 640, 12),
    (512, 2560, 12),
    (2560, 2560, 1),
    (320, 10240, 1),
]


def tile(n: int, k: int, bn: int, waves: int) -> dict:
    """BLOCK_M 16, BLOCK_K 128, and as many partitions as fill `waves` waves (two K blocks
    each at least)."""
    n_tiles, k_blocks = -(-n // bn), -(-k // 128)
    parts = max(1, min(k_blocks // 2, waves * SMS // n_tiles))
    per = -(-k_blocks // parts)
    return dict(
        BLOCK_M=16,
        BLOCK_N=bn,
        BLOCK_K=128,
        PARTS=-(-k_blocks // per),
        BLOCKS_PER_PART=per,
        num_warps=4,
        num_stages=3,
    )


def main() -> None:
    torch.manual_seed(0)
    d, bf = "cuda", torch.bfloat16
    results = []
    print("us a call at 1 / 4 rows; the best candidate against today's tile")
    for n, k, calls in SHAPES:
        w = torch.randn(n, k, device=d).to(bf)
        x = torch.randn(4, k, device=d).to(bf)
        today = tlin.tile_config(n, k, bf)
        cands = {"today": today}
        for bn in (16, 32, 64):
            for waves in (1, 2, 4):
                cands[f"n{bn} w{waves}"] = tile(n, k, bn, waves)
        rows = []
        for name, cfg in cands.items():
            us = [1e6 * timed(partial(tlin.linear, x[:r], w, tile=cfg), d, 20) for r in (1, 4)]
            rows.append(
                dict(
                    shape=[n, k], calls=calls, tile=name, parts=cfg["PARTS"], us_1=us[0], us_4=us[1]
                )
            )
        best = min(rows, key=lambda r: r["us_1"])
        base = rows[0]
        results += rows
        print(
            f"  {n:>5}x{k:<5} x{calls:<2} today {base['us_1']:6.2f} / {base['us_4']:6.2f} "
            f"({base['parts']} parts); best {best['tile']} {best['us_1']:6.2f} / "
            f"{best['us_4']:6.2f} ({best['parts']} parts): "
            f"{calls * (base['us_1'] - best['us_1']):.0f} us a token"
        )
    print(json.dumps(dict(bench="decode_parts", results=results)))


if __name__ == "__main__":
    main()
