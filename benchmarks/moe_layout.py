"""The MoE's expert-sorted layout past FUSED_DISPATCH_MAX_PAIRS (a prompt's pairs): the three
chunked launches (`kernels/moe/layout.py`, the default since it landed) against the torch
sort it replaced (`routing.dispatch_by_sort`), side by side on one GPU: tensors equal, GPU
time a call (5 calls between events after a warm one) and the host's time to enqueue one.
Flash Next's router: 512 experts, 10 a row, the shared expert's rows, tiles of 64 pairs.

    python benchmarks/moe_layout.py [--rows 2048,8192]

Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.prefill_tiles import eager
from flashlane.kernels.moe import routing


def host_us(fn, reps: int = 20) -> float:
    """Microseconds of host time to enqueue a call (the GPU left to catch up after)."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    host = (time.perf_counter() - t) * 1e6 / reps
    torch.cuda.synchronize()
    return host


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="2048,8192", help="prompt rows (default 2048,8192)")
    args = ap.parse_args()
    e, k, block_m = 512, 10, 64
    results = []
    for rows in (int(r) for r in args.rows.split(",")):
        g = torch.Generator(device="cuda").manual_seed(rows)
        ids = torch.randint(0, e, (rows, k), generator=g, device="cuda")
        calls = {
            "chunked": lambda ids=ids: routing.dispatch(ids, e, block_m, ids.shape[0]),
            "sort": lambda ids=ids: routing.dispatch_by_sort(ids, e, block_m, ids.shape[0]),
        }
        want = calls["sort"]()
        got = calls["chunked"]()
        same = all(torch.equal(a, b) for a, b in zip(got, want))
        for name, fn in calls.items():
            row = dict(rows=rows, pairs=rows * k, layout=name, same=same)
            row.update(gpu_us=eager(fn), host_us=host_us(fn))
            results.append(row)
            print(
                f"  {rows:>6} rows ({rows * k:>6} pairs)  {name:<8} GPU {row['gpu_us']:8.1f} us"
                f"  host {row['host_us']:8.1f} us  {'same' if same else 'OTHER'}"
            )
    print(
        json.dumps(dict(bench="moe_layout", experts=e, top_k=k, block_m=block_m, results=results))
    )


if __name__ == "__main__":
    main()
