"""The small decode products with their weights cold, as in a decode step (issue 9).

In a step each weight is read once, from DRAM; `bench_linears` and `decode_parts` call one
weight back to back, so a weight under the L2's 50 MB is read from L2 after the first call.
Here each call of a CUDA graph reads another copy of the weight (copies enough for 256 MB), so
every call reads DRAM; the same calls on one copy give the warm figure. For each product of
a flashnext-12l step whose time is furthest above its bytes', today's tile against tile
shapes that keep its spans of K (the same bits: checked here against today's output) and,
marked `new bits`, other partitions. One row (`--rows N`: N decode rows, each row also
checked against itself alone in the tile), each call as the model makes it (the
hyper-connection's down squashing its columns as it stores them, its up reading a column
slice). GPU only; a table and one JSON line.

    python benchmarks/cold_linears.py [--rows 16]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from functools import partial

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_linears import timed
from flashlane.kernels.linear import triton as tlin
from flashlane.kernels.pdl import enabled as pdl_enabled

COLD_BYTES = 256 << 20


def variants(n: int, k: int) -> dict[str, dict]:
    """Today's decode tile and others: same spans of K unless the name says new bits."""
    today = tlin.tile_config(n, k, torch.bfloat16)
    span = today["BLOCK_K"] * today["BLOCKS_PER_PART"]
    out = {"today": today}
    for bk in (32, 64):
        if span % bk == 0:
            out[f"k{bk}"] = dict(today, BLOCK_K=bk, BLOCKS_PER_PART=span // bk)
    for bn in (32, 128):
        out[f"n{bn}"] = dict(today, BLOCK_N=bn)
    for stages in (2, 4):
        out[f"s{stages}"] = dict(today, num_stages=stages)
    out["w8"] = dict(today, num_warps=8)
    if today["PARTS"] > 1:  # every partition in one program: no partial sums to add after
        for bn in (16, 32):
            out[f"one program n{bn}"] = dict(today, BLOCK_N=bn, SPLIT=False)
            out[f"one program n{bn} w8"] = dict(today, BLOCK_N=bn, SPLIT=False, num_warps=8)
    out["m64"] = dict(today, BLOCK_M=64)
    k_blocks = -(-k // 128)
    for parts in (today["PARTS"] // 2, today["PARTS"] * 2):
        if 1 <= parts <= k_blocks and parts != today["PARTS"]:
            per = -(-k_blocks // parts)
            out[f"p{-(-k_blocks // per)} new bits"] = dict(
                today, BLOCK_K=128, PARTS=-(-k_blocks // per), BLOCKS_PER_PART=per
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1, help="decode rows a call (default 1)")
    rows = ap.parse_args().rows
    torch.manual_seed(0)
    d, bf = "cuda", torch.bfloat16
    # (name, N, K, calls a token, squash (cols, hc) or None, fp32 out, x a column slice):
    # the hyper-connection's down squashes its first 320 columns as it stores them, its up
    # reads them as a column slice
    shapes = [
        ("hc down (squash)", 324, 10240, 24, (320, 4), False, False),
        ("hc up", 10240, 320, 24, None, False, True),
        ("shared in", 1281, 2560, 12, None, False, False),
        ("shared down", 2560, 640, 12, None, False, False),
        ("router", 512, 2560, 12, None, True, False),
        ("out proj", 2560, 6144, 12, None, False, False),
    ]
    only = os.environ.get("COLD_ONLY", "")
    shapes = [s for s in shapes if not only or s[0].startswith(only)]
    results = []
    print(f"PDL {'on' if pdl_enabled() else 'off'}; us a call at {rows} row(s), cold / warm (L2)")
    for name, n, k, calls, squash, fp32, strided in shapes:
        copies = max(2, COLD_BYTES // (n * k * 2))
        ws = [torch.randn(n, k, device=d).to(bf) for _ in range(copies)]
        wide = torch.randn(rows, k + 4, device=d).to(bf)
        x = wide[:, :k] if strided else wide[:, :k].contiguous()
        out = torch.float32 if fp32 else None
        ref = tlin.linear(x, ws[0], out_dtype=out, squash=squash)
        for tag, cfg in variants(n, k).items():
            try:
                got = tlin.linear(x, ws[0], out_dtype=out, squash=squash, tile=cfg)
            except Exception as e:  # a tile the compiler refuses: say so, go on
                print(f"{name:>16} {tag:>14}: {type(e).__name__}")
                continue
            same = bool(torch.equal(got, ref))
            alone = range(rows) if rows > 1 else ()  # each row alone in the tile
            for i in alone:
                one = tlin.linear(x[i : i + 1], ws[0], out_dtype=out, squash=squash, tile=cfg)
                same = same and bool(torch.equal(one[0], got[i]))

            def cold(cfg=cfg, ws=ws, x=x, out=out, squash=squash):
                for w in ws:
                    tlin.linear(x, w, out_dtype=out, squash=squash, tile=cfg)

            warm = partial(tlin.linear, x, ws[0], out_dtype=out, squash=squash, tile=cfg)
            us_cold = 1e6 * timed(cold, d, 2) / copies
            us_warm = 1e6 * timed(warm, d, 40)
            gbs = n * k * 2 / us_cold / 1e3
            results.append(
                dict(
                    product=name,
                    rows=rows,
                    shape=[n, k],
                    calls=calls,
                    tile=tag,
                    parts=cfg["PARTS"],
                    same_bits=same,
                    us_cold=us_cold,
                    us_warm=us_warm,
                    cold_gbps=gbs,
                )
            )
            print(
                f"{name:>16} {tag:>14}: {us_cold:7.2f} / {us_warm:6.2f} us  {gbs:6.0f} GB/s "
                f"cold  parts {cfg['PARTS']:3d}  {'same bits' if same else 'OTHER BITS'}"
            )
        ws.clear()
    today = sum(r["us_cold"] * r["calls"] for r in results if r["tile"] == "today")
    best = {}
    for r in results:
        if r["same_bits"] and r["us_cold"] < best.get(r["product"], r)["us_cold"] + 1e-9:
            best[r["product"]] = r
    better = sum(r["us_cold"] * r["calls"] for r in best.values())
    print(f"a token, cold: today {today / 1e3:.3f} ms, best same-bit tiles {better / 1e3:.3f} ms")
    print(
        json.dumps(
            {"bench": "cold_linears", "rows": rows, "pdl": pdl_enabled(), "results": results}
        )
    )


if __name__ == "__main__":
    main()
