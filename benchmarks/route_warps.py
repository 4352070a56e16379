"""The MoE's decode front at one row by warps: 24 chained (router product, expert pick,
slot layout) in one graph, with the pick's and the layout's programs on 1, 2 or 4 warps
(routing.ROUTE_WARPS, DISPATCH_WARPS). The pick's softmax sum is a reduction over the
program's warps, so its weights' bits follow ROUTE_WARPS (the table says whether they equal
today's); the ids and the layout never change. GPU only.

    python benchmarks/route_warps.py
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_linears import timed
from flashlane.kernels.linear.triton import linear
from flashlane.kernels.moe import routing

CHAIN, E, H, TOP_K = 24, 512, 2560, 10


def main() -> None:
    d, bf = "cuda", torch.bfloat16
    torch.manual_seed(0)
    routers = [(torch.randn(E + 1, H, device=d) * H**-0.5).to(bf) for _ in range(CHAIN)]
    xs = [torch.randn(1, H, device=d).to(bf) for _ in range(CHAIN)]

    def chain():
        out = []
        for x, router in zip(xs, routers):
            logits = linear(x, router, out_dtype=torch.float32, aligned=True)
            w, ids = routing.pick_experts(logits[:, :E], TOP_K, True, bf)
            out.append((w, ids, *routing.dispatch(ids, E, 16, shared_rows=1)))
        return out

    want = chain()
    rows = []
    for rw in (4, 2, 1):
        for dw in (4, 2, 1):
            routing.ROUTE_WARPS, routing.DISPATCH_WARPS = rw, dw
            got = chain()
            same_w = all(torch.equal(a[0], b[0]) for a, b in zip(got, want))
            same_rest = all(
                all(torch.equal(x, y) for x, y in zip(a[1:], b[1:])) for a, b in zip(got, want)
            )
            us = 1e6 * timed(chain, d, 2) / CHAIN
            rows.append(
                dict(
                    route_warps=rw,
                    dispatch_warps=dw,
                    us_a_layer=us,
                    same_weights=same_w,
                    same_ids_layout=same_rest,
                )
            )
            print(
                f"  pick {rw} warps, layout {dw} warps: {us:6.2f} us a layer (router "
                f"product included)  weights {'same' if same_w else 'other'} bits  ids and "
                f"layout {'same' if same_rest else 'DIFFER'}"
            )
    print(json.dumps({"bench": "route_warps", "chain": CHAIN, "rows": rows}))


if __name__ == "__main__":
    main()
