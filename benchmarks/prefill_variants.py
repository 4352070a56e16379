"""Prefill-size linears in their variants (issue 9): for each (N, K) at --rows rows, the tile
the model uses now against, where it runs every partition in one program (FLAT), wider tiles
with the same spans of K in each loop over the partitions (`LOOPS`), and the router's fp32-out product on the
CUDA cores' FMA chains against the tensor cores (`_TENSOR_CORE_FP32_OUT`). Each variant's
output is compared bitwise with the default's ("same" / "OTHER"; the router's tensor-core
variant is expected to differ). GPU only; timed as 3 calls in one CUDA graph. Prints a table
and one JSON line.

    python benchmarks/prefill_variants.py --rows 2048
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

SHAPES = [(324, 10240), (2560, 6144), (1281, 2560), (16480, 2560), (10240, 320), (2560, 640)]
# wider tiles than the decode one (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)
WIDER = [
    (64, 64, 128, 4, 3),
    (128, 64, 64, 4, 3),
    (128, 128, 64, 8, 3),
    (128, 128, 64, 8, 4),
    (128, 256, 64, 8, 3),
]
# the loops over the partitions (kernels/linear/partitions.py): one loop with a select at
# every block (FLAT 1), one loop with a branch at each partition's end (2), a pipeline a
# partition (0). (fcde8a7 also had the loop nest flattened by the compiler: as the branch)
LOOPS = {1: "flat", 2: "branch", 0: "loop"}


def variants(n: int, k: int, rows: int, loops=(1, 2, 0)) -> dict[str, dict]:
    """name -> tile (tile_config's keys) with the spans of (n, k)'s partitions: the tile the
    model uses now, and for a tile that runs its partitions in one loop (FLAT), WIDER's tiles
    in each of `loops`."""
    base = (tlin.tile_config if rows <= tlin.DECODE_ROWS else tlin.prefill_tile)(
        n, k, torch.bfloat16
    )
    span = base["BLOCK_K"] * base["BLOCKS_PER_PART"]
    out = {"now": base}
    if not base.get("FLAT"):
        return out
    for bm, bn, bk, warps, stages in WIDER:
        if span % bk:
            continue
        for flat in loops:
            out[f"{bm}x{bn}x{bk} w{warps} s{stages} {LOOPS[flat]}"] = dict(
                base,
                BLOCK_M=bm,
                BLOCK_N=bn,
                BLOCK_K=bk,
                BLOCKS_PER_PART=span // bk,
                num_warps=warps,
                num_stages=stages,
                FLAT=flat,
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2048)
    args = ap.parse_args()
    torch.manual_seed(0)
    d, bf, rows = "cuda", torch.bfloat16, args.rows
    tlin._IN_PROGRAM_TILES = 1  # prefill rows: every tile runs its partitions in-program
    results = []
    print(f"linears at {rows} rows (us a call; bits against 'now')")
    for n, k in SHAPES:
        x = torch.randn(rows, k, device=d).to(bf)
        w = torch.randn(n, k, device=d).to(bf)
        want = tlin.linear(x, w)
        flops = 2.0 * rows * n * k
        for name, tile in variants(n, k, rows).items():
            try:
                us = 1e6 * timed(partial(tlin.linear, x, w, tile=tile), d, 3)
                same = torch.equal(tlin.linear(x, w, tile=tile), want)
            except Exception as err:  # a tile that does not fit (shared memory, registers)
                print(f"  {n}x{k} {name}: {type(err).__name__}")
                continue
            results.append(
                dict(shape=[n, k], variant=name, us=us, same=same, tflops=flops / us / 1e6)
            )
            print(
                f"  {n:>6}x{k:<6} {name:<26} {us:9.1f} {flops / us / 1e6:7.1f} TF/s "
                f"{'same' if same else 'OTHER'}"
            )
    # the router: fp32 out of bf16 inputs
    x = torch.randn(rows, 2560, device=d).to(bf)
    w = torch.randn(512, 2560, device=d).to(bf)
    for r in sorted({1, rows}):
        cuda_cores = 1e6 * timed(partial(tlin.linear, x[:r], w, out_dtype=torch.float32), d, 3)
        want = tlin.linear(x[:r], w, out_dtype=torch.float32)
        tlin._TENSOR_CORE_FP32_OUT = True
        tensor = 1e6 * timed(partial(tlin.linear, x[:r], w, out_dtype=torch.float32), d, 3)
        got = tlin.linear(x[:r], w, out_dtype=torch.float32)
        tlin._TENSOR_CORE_FP32_OUT = False
        err = ((got - want).abs().max() / want.abs().max()).item()
        results.append(
            dict(
                shape=[512, 2560],
                variant=f"router {r} rows",
                us_fma=cuda_cores,
                us_tensor_cores=tensor,
                rel_err=err,
            )
        )
        print(
            f"  router 512x2560 at {r} rows: FMA chains {cuda_cores:.1f} us, tensor cores "
            f"{tensor:.1f} us, largest difference {err:.2e} of the largest logit"
        )
    print(json.dumps(dict(bench="prefill_variants", rows=rows, results=results)))


if __name__ == "__main__":
    main()
