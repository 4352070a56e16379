"""Prompt tiles through TMA (kernels/tma.py) against pointer loads, side by side: flashnext-12l's
prompt products (bf16) at 2,048 and 8,192 rows, each timed eagerly between events with
tma.PROMPT off and on, its rate, and whether the two outputs are equal bit for bit. The
experts' grouped launches: benchmarks/moe_prefill_tiles.py. GPU only; a table and one JSON line.

    python benchmarks/tma_prompt.py [--rows 2048,8192]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.prefill_tiles import eager
from flashlane.kernels import tma
from flashlane.kernels.linear import triton as tlin

# (name, N, K): the GDN in projection, attention q, the output projections, the
# hyper-connections' down (their up runs rowwise/triton_hc_up.py's kernel), the router
SHAPES = [
    ("gdn in", 16480, 2560),
    ("attn q", 12288, 2560),
    ("gdn out", 2560, 6144),
    ("hc down", 324, 10240),
    ("router", 513, 2560),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="2048,8192")
    args = ap.parse_args()
    torch.manual_seed(0)
    results = []
    for m in (int(r) for r in args.rows.split(",")):
        for name, n, k in SHAPES:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            w = (torch.randn(n, k, device="cuda") * k**-0.5).to(torch.bfloat16)
            out, us = {}, {}
            for on in (False, True):
                tma.PROMPT = on
                out[on] = tlin.linear(x, w)
                us[on] = eager(lambda x=x, w=w: tlin.linear(x, w))
            tma.PROMPT = False
            flops = 2.0 * m * n * k
            same = torch.equal(out[False], out[True])
            row = dict(rows=m, product=name, n=n, k=k, us_plain=us[False], us_tma=us[True],
                       tflops_plain=flops / us[False] / 1e6, tflops_tma=flops / us[True] / 1e6,
                       same=same)  # fmt: skip
            results.append(row)
            print(
                f"{m:>5} rows {name:<9} {n:>5} x {k:<5} pointer {us[False]:8.1f} us "
                f"({row['tflops_plain']:5.1f} TF/s)  tma {us[True]:8.1f} us "
                f"({row['tflops_tma']:5.1f})  {us[False] / us[True]:5.2f}x  "
                f"{'same' if same else 'OTHER'}"
            )
    print(json.dumps(dict(bench="tma_prompt", results=results)))


if __name__ == "__main__":
    main()
