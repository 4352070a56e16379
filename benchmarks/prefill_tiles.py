"""Prefill-size tiles against decode tiles, one shape at a time (issue 9): the linear at 2,048
rows in each (N, K)'s decode tile (`tile_config`) and prefill tile (`prefill_tile`), and the
MoE experts at 2,048 and 8,192 rows in 16-pair and 64-pair tiles. GPU only; prints a table.
The linears are timed as 3 calls in one CUDA graph (bench_linears.timed); the MoE eagerly
between events (its dispatch above 1,024 pairs sorts), 5 calls after a warm one.

    python benchmarks/prefill_tiles.py

H200, 7c4b5d8: results/prefill_tiles_h200_7c4b5d8.log.
"""

from __future__ import annotations

import os
import sys
from functools import partial

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_linears import timed
from flashlane.kernels.linear import triton as tlin
from flashlane.kernels.moe import triton as tmoe

SHAPES = [(16480, 2560), (324, 10240), (1281, 2560), (2560, 6144), (10240, 320), (2560, 640)]


def eager(fn, reps: int = 5) -> float:
    """Microseconds a call, `reps` calls between two events after a warm one."""
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / reps


def main() -> None:
    torch.manual_seed(0)
    d, bf, rows = "cuda", torch.bfloat16, 2048
    print(f"linear at {rows} rows: decode tile / prefill tile (us)")
    for n, k in SHAPES:
        x = torch.randn(rows, k, device=d).to(bf)
        w = torch.randn(n, k, device=d).to(bf)
        us = [
            1e6 * timed(partial(tlin.linear, x, w, tile=tile(n, k, bf)), d, 3)
            for tile in (tlin.tile_config, tlin.prefill_tile)
        ]
        print(f"  {n}x{k}: {us[0]:8.1f} {us[1]:8.1f}  {us[0] / us[1]:5.2f}x")
    h, e, i, top = 2560, 512, 640, 10
    g = torch.randn(e, i, h, device=d).to(bf) * h**-0.5
    u = torch.randn(e, i, h, device=d).to(bf) * h**-0.5
    dn = torch.randn(e, h, i, device=d).to(bf) * i**-0.5
    r = torch.randn(e, h, device=d).to(bf)
    for m in (2048, 8192):
        x = torch.randn(m, h, device=d).to(bf)
        wts, ids = tmoe.route(x, r, top, True)
        call = partial(tmoe.experts, x, wts, ids, g, u, dn)
        big = eager(call)
        tmoe.DECODE_ROWS = 10**9  # every call in 16-pair tiles
        small = eager(call)
        tmoe.DECODE_ROWS = tlin.DECODE_ROWS
        print(f"moe experts {m} rows: 16-pair tiles {small:9.1f} us, 64-pair tiles {big:9.1f} us")


if __name__ == "__main__":
    main()
