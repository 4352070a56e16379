"""The hyper-connections' reads at one row, chained as a decode step chains them (issue 9).

A flashnext-12l step makes 24 reads, each with its own weights: grouped norm, the down
projection (324 x 10240, its 320 low-rank columns squashed as stored), the up projection
with the mix (hc_up_mix), then the write. Here 24 such reads with 24 weight sets run in one
CUDA graph (every weight read from DRAM, each launch after the one it depends on, as in a
step), with the down projection in today's decode tile (its K partitions split over
programs, the last program of each tile adding them) and in tiles with the same spans of K
(every partition in one program; the same bits, checked against today's). GPU only; a
table and one JSON line. Then, at 8,192 rows (a prompt piece), the up projection with the
mix in one launch (hc_up_mix) against the linear then hc_mix, eagerly.

    python benchmarks/hc_read_chain.py
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_linears import timed
from benchmarks.prefill_tiles import eager
from flashlane.kernels.linear.tiles import tile_config
from flashlane.kernels.linear.triton import linear
from flashlane.kernels.norms.triton import rms_norm
from flashlane.kernels.rowwise.triton_hc import hc_mix, hc_write
from flashlane.kernels.rowwise.triton_hc_up import hc_up_mix

H, HC, LOW, READS = 2560, 4, 320, 24


def main() -> None:
    d, bf = "cuda", torch.bfloat16
    torch.manual_seed(0)
    reads = [
        dict(
            norm=(torch.randn(HC * H, device=d) * 0.1).to(bf),
            down=(torch.randn(LOW + HC, HC * H, device=d) * (HC * H) ** -0.5).to(bf),
            up=(torch.randn(HC * H, LOW, device=d) * LOW**-0.5).to(bf),
        )
        for _ in range(READS)
    ]
    r0 = torch.randn(1, HC * H, device=d).to(bf)
    today = tile_config(LOW + HC, HC * H, bf)
    up_today = tile_config(HC * H, LOW, bf)
    # (down tile, up tile): None is today's; every variant keeps the partitions, so the bits
    variants = {"today": (None, None)}
    for warps in (2, 8):
        variants[f"down w{warps}"] = (dict(today, num_warps=warps), None)
        variants[f"up w{warps}"] = (None, dict(up_today, num_warps=warps))
    variants["down k64 s4"] = (
        dict(today, BLOCK_K=64, BLOCKS_PER_PART=2 * today["BLOCKS_PER_PART"], num_stages=4),
        None,
    )
    variants["down s4"] = (dict(today, num_stages=4), None)
    variants["up k64 s4"] = (None, dict(up_today, BLOCK_K=64, BLOCKS_PER_PART=5, num_stages=4))
    variants["up k64 s2"] = (None, dict(up_today, BLOCK_K=64, BLOCKS_PER_PART=5, num_stages=2))
    variants["up n128"] = (None, dict(up_today, BLOCK_N=128))
    variants["up k64 s4 n128"] = (
        None,
        dict(up_today, BLOCK_K=64, BLOCKS_PER_PART=5, num_stages=4, BLOCK_N=128),
    )

    def chain(tiles):
        down_tile, up_tile = tiles
        r = r0
        for w in reads:
            xn = rms_norm(r, w["norm"], 1e-6, H)
            both = linear(xn, w["down"], squash=(LOW, HC), tile=down_tile)
            a, mix = hc_up_mix(both[:, :LOW], w["up"], xn, both[:, LOW:], HC, tile=up_tile)
            r = hc_write(r, a, mix)
        return r

    want = chain((None, None))
    print(f"{READS} reads at one row in one graph; today's down tile: {today}, up: {up_today}")
    results = []
    for name, tile in variants.items():
        try:
            same = bool(torch.equal(chain(tile), want))
            us = 1e6 * timed(lambda tile=tile: chain(tile), d, 2) / READS
        except Exception as e:  # a tile the compiler refuses: say so, go on
            print(f"  {name:<24} {type(e).__name__}: {e}")
            continue
        results.append(dict(tiles=name, us_a_read=us, same_bits=same))
        print(f"  {name:<24} {us:7.2f} us a read  {'same bits' if same else 'other bits'}")
    rows = 8192
    both = torch.randn(rows, LOW + HC + 12, device=d).to(bf)  # hc_down's padded rows
    xn = torch.randn(rows, HC * H, device=d).to(bf)
    s, inj, up = both[:, :LOW], both[:, LOW : LOW + HC], reads[0]["up"]
    fused = hc_up_mix(s, up, xn, inj, HC)
    two = hc_mix(linear(s, up), xn, inj, HC)
    same = all(bool(torch.equal(a, b)) for a, b in zip(fused, two))
    prompt = dict(
        rows=rows,
        same_bits=same,
        us_up_mix=eager(lambda: hc_up_mix(s, up, xn, inj, HC)),
        us_linear_then_mix=eager(lambda: hc_mix(linear(s, up), xn, inj, HC)),
    )
    print(
        f"  {rows} rows: hc_up_mix {prompt['us_up_mix']:.1f} us, linear + hc_mix "
        f"{prompt['us_linear_then_mix']:.1f} us  {'same bits' if same else 'OTHER BITS'}"
    )
    print(json.dumps(dict(bench="hc_read_chain", reads=READS, results=results, prompt=prompt)))


if __name__ == "__main__":
    main()
