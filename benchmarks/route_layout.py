"""The MoE's decode front by row count, as a decode step runs it: the router product, then
the pick with the pairs' layout in its launch (`routing.pick_and_lay_out`), 24 layers
chained in one CUDA graph, at 1, 4, 16 and 64 rows (10 to 640 pairs); and the layout alone
(`routing.dispatch_fused`). Each layout is checked against `dispatch_by_sort`'s tensors.
At 85925d6 the route kernel took ~30 us a layer at 16 rows on the H100 (a walk of the pairs
through one-hot tiles); 656c213 sorts them at once.

    python benchmarks/route_layout.py [--rows 1,4,16,64]
    TRITON_INTERPRET=1 python benchmarks/route_layout.py --smoke   # the script's own check
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_linears import timed
from flashlane.kernels.linear.triton import linear
from flashlane.kernels.moe import routing

CHAIN, E, H, TOP_K, BLOCK_M = 24, 512, 2560, 10, 16


def front(rows: int, device: str, calls: int) -> dict:
    """One row count: the chain's time a layer, the layout's alone, and whether each layout
    equals the sort's."""
    g = torch.Generator(device=device).manual_seed(rows)
    bf = torch.bfloat16
    routers = [
        (torch.randn(E + 1, H, device=device, generator=g) * H**-0.5).to(bf) for _ in range(CHAIN)
    ]
    xs = [torch.randn(rows, H, device=device, generator=g).to(bf) for _ in range(CHAIN)]

    def chain():
        out = []
        for x, router in zip(xs, routers):
            logits = linear(x, router, out_dtype=torch.float32, aligned=True)
            out.append(routing.pick_and_lay_out(logits[:, :E], TOP_K, True, bf, BLOCK_M, rows))
        return out

    got = chain()  # the counters exist before a capture
    same = all(
        all(map(torch.equal, lay, routing.dispatch_by_sort(ids, E, BLOCK_M, rows)))
        for _, ids, *lay in got
    )
    ids = [r[1] for r in got]
    layer_us = 1e6 * timed(chain, device, calls) / CHAIN
    alone_us = 1e6 * timed(
        lambda: [routing.dispatch_fused(i, E, BLOCK_M, rows) for i in ids], device, calls
    ) / CHAIN  # fmt: skip
    return dict(rows=rows, pairs=rows * TOP_K, layer_us=layer_us, layout_us=alone_us, same=same)


def main() -> None:
    global CHAIN, E, H
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,4,16,64")
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--smoke", action="store_true", help="small shapes through the interpreter")
    args = ap.parse_args()
    device = "cpu" if args.smoke else "cuda"
    if args.smoke:
        CHAIN, E, H = 2, 64, 128
    elif not torch.cuda.is_available():
        raise SystemExit("route_layout: needs an NVIDIA GPU (or --smoke under TRITON_INTERPRET=1)")
    results = [front(int(r), device, args.calls) for r in args.rows.split(",")]
    print(f"{'rows':>5} {'pairs':>6} {'front us a layer':>17} {'layout alone us':>16}  layout")
    for r in results:
        print(f"{r['rows']:5d} {r['pairs']:6d} {r['layer_us']:17.2f} {r['layout_us']:16.2f}  "
              f"{'== sort' if r['same'] else 'DIFFERS from the sort'}")  # fmt: skip
    name = "cpu (interpreter)" if args.smoke else torch.cuda.get_device_name()
    print(json.dumps(dict(bench="route_layout", device=name, chain=CHAIN, rows=results)))
    if not all(r["same"] for r in results):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
