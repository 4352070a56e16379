"""The MoE experts' prefill tiles (issue 9): flashnext-12l's experts (512 of width 640 over
2,560, top-10, random weights routing evenly) at 2,048 and 8,192 rows in candidate tiles
(pairs a tile, then gate/up and down tiles; gate's and up's columns in one dot, JOIN, was
timed here and removed: no gain, results/moe_prefill_tiles_h100_d68acca_*),
each timed eagerly between events (the dispatch above 1,024 pairs sorts) and its output
compared bitwise with the default tiles' ("same" / "OTHER"). GPU only; prints a table and
one JSON line (scripts/gpu_check.sh `moe-tiles`).

    python benchmarks/moe_prefill_tiles.py
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.prefill_tiles import eager
from flashlane.kernels.moe import triton as tmoe


def tile(n: int, k: int, warps: int, stages: int, block_major: bool = True) -> dict:
    return dict(BLOCK_N=n, BLOCK_K=k, num_warps=warps, num_stages=stages, BLOCK_MAJOR=block_major)


# "blk": a pair block's column tiles launched together (BLOCK_MAJOR), "col": the pair blocks
# of a column tile together
CANDIDATES = {
    "default": (tmoe.PREFILL_BLOCK_M, tmoe.GATE_UP_PREFILL, tmoe.DOWN_PREFILL),
    "64 col: gu 64x64 w4 s3, dn 128x64 w4 s3": (
        64,
        tile(64, 64, 4, 3, False),
        tile(128, 64, 4, 3, False),
    ),
    "64 blk: gu 64x64 w4 s3, dn 128x64 w4 s3": (64, tile(64, 64, 4, 3), tile(128, 64, 4, 3)),
    "64 blk: gu 64x64 w4 s4, dn 128x64 w4 s4": (64, tile(64, 64, 4, 4), tile(128, 64, 4, 4)),
    "64 blk: gu 128x64 w8 s3, dn 256x64 w8 s3": (64, tile(128, 64, 8, 3), tile(256, 64, 8, 3)),
    "64 blk: gu 64x128 w4 s3, dn 128x128 w4 s3": (64, tile(64, 128, 4, 3), tile(128, 128, 4, 3)),
    "64 blk: gu 128x64 w4 s3, dn 128x64 w8 s3": (64, tile(128, 64, 4, 3), tile(128, 64, 8, 3)),
    "128 blk: gu 64x64 w8 s3, dn 128x64 w8 s3": (128, tile(64, 64, 8, 3), tile(128, 64, 8, 3)),
    "128 blk: gu 128x64 w8 s3, dn 256x64 w8 s3": (128, tile(128, 64, 8, 3), tile(256, 64, 8, 3)),
}


def main() -> None:
    torch.manual_seed(0)
    d, bf = "cuda", torch.bfloat16
    h, e, i, top = 2560, 512, 640, 10
    g = torch.randn(e, i, h, device=d).to(bf) * h**-0.5
    u = torch.randn(e, i, h, device=d).to(bf) * h**-0.5
    dn = torch.randn(e, h, i, device=d).to(bf) * i**-0.5
    r = torch.randn(e, h, device=d).to(bf)
    saved = CANDIDATES["default"]
    results = []
    for m in (2048, 8192):
        x = torch.randn(m, h, device=d).to(bf)
        wts, ids = tmoe.route(x, r, top, True)
        call = partial(tmoe.experts, x, wts, ids, g, u, dn)
        want = call()
        flops = 2.0 * m * top * 3 * i * h
        for name, (bm, gu, dn_tile) in CANDIDATES.items():
            tmoe.PREFILL_BLOCK_M, tmoe.GATE_UP_PREFILL, tmoe.DOWN_PREFILL = bm, gu, dn_tile
            try:
                us = eager(call)
                same = torch.equal(call(), want)
            except Exception as err:  # a tile that does not fit
                print(f"  {m} rows {name}: {type(err).__name__}")
                continue
            finally:
                tmoe.PREFILL_BLOCK_M, tmoe.GATE_UP_PREFILL, tmoe.DOWN_PREFILL = saved
            results.append(dict(rows=m, tiles=name, us=us, tflops=flops / us / 1e6, same=same))
            print(
                f"  {m:>5} rows  {name:<44} {us:9.1f} us {flops / us / 1e6:7.1f} TF/s "
                f"{'same' if same else 'OTHER'}"
            )
    print(json.dumps(dict(bench="moe_prefill_tiles", results=results)))


if __name__ == "__main__":
    main()
