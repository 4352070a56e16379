"""Tiles of the row-invariant Triton linear at the model's decode shapes (issue 9): each
candidate's GPU time at a few row counts, and whether tiles that differ only in BLOCK_M and
BLOCK_N give the same bits (BLOCK_M 16 runs mma.sync, 64 runs wgmma on sm_90: if their bits
agree, BLOCK_M may follow M without breaking row invariance; if not, it may not).

    python benchmarks/tune_linears.py --device cuda [--config flashnext-12l] [--jobs 14]

Each candidate is (BLOCK_M, BLOCK_N, BLOCK_K, stages, PARTS); PARTS is set to fill about one
or two waves of the SMs at decode. Compiles run first in `--jobs` processes (they fill
Triton's disk cache); timing is `bench_linears.timed` (calls in one CUDA graph between
events). The bit check runs every candidate on the same inputs (normal values, and values
spread over 2^-12..2^12 so that alignment inside the tensor cores matters) at the largest row
count and compares bits within each (BLOCK_K, PARTS) group. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_linears import products, timed
from flashlane.kernels import select_kernels
from flashlane.kernels.linear.triton import linear, tile_config
from flashlane.models.presets import preset
from flashlane.models.random_weights import build_random

SMS = 132


def candidates(n: int, k: int, fp32: bool) -> list[dict]:
    """bf16 tiles of BLOCK_M 16 and 64; fp32 products (FMAs) with BLOCK_M 16 and small K.
    PARTS fills about two waves of the SMs at one row."""
    out = []
    for bm in (16,) if fp32 else (16, 64):
        for bn in (64, 128):
            for bk, stages in ((32, 2), (64, 2)) if fp32 else ((64, 4), (128, 3)):
                n_tiles, k_blocks = -(-n // bn), -(-k // bk)
                parts = max(1, min(k_blocks // 2, (2 * SMS) // n_tiles))
                per = -(-k_blocks // parts)
                parts = -(-k_blocks // per)
                out.append(
                    dict(
                        BLOCK_M=bm,
                        BLOCK_N=bn,
                        BLOCK_K=bk,
                        PARTS=parts,
                        BLOCKS_PER_PART=per,
                        num_warps=4,
                        num_stages=stages,
                    )
                )
    return out


def prefill_candidates(n: int, k: int, fp32: bool) -> list[dict]:
    """Big tiles for many rows, one per partition split of the decode candidates (the same
    partitions, so the bits can match theirs): timed at the prefill row count only."""
    if fp32:
        return []
    out, seen = [], set()
    for t in candidates(n, k, fp32):
        span = (t["BLOCK_K"], t["PARTS"], t["BLOCKS_PER_PART"])
        if t["BLOCK_K"] != 64 or span in seen:
            continue
        seen.add(span)
        for bm, bn, warps, stages in ((128, 128, 8, 3), (64, 128, 4, 4)):
            out.append(dict(t, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages))
    return out


def name(t: dict) -> str:
    return (
        f"m{t['BLOCK_M']}n{t['BLOCK_N']}k{t['BLOCK_K']}w{t['num_warps']}"
        f"s{t['num_stages']}p{t['PARTS']}"
    )


def _compile(job) -> str | None:
    """Run one tile once at a decode and a prefill row count (fills the disk cache); None if
    it does not compile or run."""
    n, k, fp32, tile, device, prefill = job
    try:
        w = torch.randn(n, k, device=device).to(torch.bfloat16)
        for m in (1, prefill):
            x = torch.randn(m, k, device=device).to(torch.bfloat16)
            linear(x, w, out_dtype=torch.float32 if fp32 else None, tile=tile)
    except Exception as e:  # a tile too big for shared memory, say
        print(f"{name(tile)} at {n}x{k}: {type(e).__name__}: {str(e)[:120]}")
        return None
    return name(tile)


def spread(m: int, k: int, g: torch.Generator, device: str) -> torch.Tensor:
    """Values whose exponents spread over 2^-12..2^12."""
    e = torch.randint(-12, 13, (m, k), generator=g, device=device).float()
    return (torch.randn(m, k, generator=g, device=device) * torch.exp2(e)).to(torch.bfloat16)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="flashnext-12l")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rows", default="1,16,64")
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--jobs", type=int, default=14)
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    _, model = build_random(preset(args.config), torch.bfloat16, args.device, 0)
    model.use_kernels(select_kernels(args.device))
    shapes = [
        (n, k, kind, w, nm)
        for (n, k, kind), (w, nm, _) in sorted(products(model).items())
        if kind != "plain" or n < 100_000
    ]  # the lm_head streams at the copy rate already
    jobs = [
        (n, k, kind == "router fp32", t, args.device, args.prefill)
        for n, k, kind, _, _ in shapes
        for t in candidates(n, k, kind == "router fp32")
        + prefill_candidates(n, k, kind == "router fp32")
    ]
    t0 = time.perf_counter()
    if args.device == "cuda":
        with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
            done = list(pool.map(_compile, jobs))
    else:
        done = [_compile(j) for j in jobs]
    ok = {(j[0], j[1], d) for j, d in zip(jobs, done, strict=True) if d is not None}
    print(
        f"compiled {len(ok)} of {len(jobs)} candidates in {time.perf_counter() - t0:.0f} s",
        flush=True,
    )
    g = torch.Generator(device=args.device).manual_seed(0)
    report = []
    with torch.no_grad():
        for n, k, kind, w, nm in shapes:
            fp32 = kind == "router fp32"
            out_dtype = torch.float32 if fp32 else None
            default = tile_config(n, k, torch.float32 if fp32 else w.dtype)
            xs = {m: torch.randn(m, k, device=args.device).to(w.dtype) for m in rows}
            xp = torch.randn(args.prefill, k, device=args.device).to(w.dtype)
            checks = [
                torch.randn(64, k, generator=g, device=args.device).to(w.dtype),
                spread(64, k, g, args.device),
            ]
            wide = spread(n, k, g, args.device)
            rows_out = []
            groups: dict[tuple, list] = {}
            tiles = [t for t in candidates(n, k, fp32) if (n, k, name(t)) in ok]
            big = [t for t in prefill_candidates(n, k, fp32) if (n, k, name(t)) in ok]
            for t in [default, *tiles, *big]:
                decode = t is default or any(t is c for c in tiles)

                def call(x, t=t, w=w, out_dtype=out_dtype):
                    return lambda: linear(x, w, out_dtype, tile=t)

                us = (
                    {m: 1e6 * timed(call(xs[m]), args.device, args.calls) for m in rows}
                    if decode
                    else {}
                )
                us[args.prefill] = 1e6 * timed(call(xp), args.device, 3)
                bits = [linear(c, w, out_dtype, tile=t) for c in checks]
                bits.append(linear(checks[1], wide, out_dtype, tile=t))
                span = (t["BLOCK_K"] * t["BLOCKS_PER_PART"], t["PARTS"])
                groups.setdefault(span, []).append((t, bits))
                rows_out.append(dict(tile=name(t), default=t is default, decode=decode, us=us))
            # bits within each K split: for the same BLOCK_K (only BLOCK_M / N / warps /
            # stages differ), and across BLOCK_K (the same partition spans)
            agree = {}
            for (span, parts), members in groups.items():
                ref = members[0][1]
                same = [
                    all(torch.equal(a, b) for a, b in zip(ref, bits, strict=True))
                    for _, bits in members[1:]
                ]
                same_k = [
                    s
                    for (t, _), s in zip(members[1:], same, strict=True)
                    if t["BLOCK_K"] == members[0][0]["BLOCK_K"]
                ]
                agree[f"span{span}p{parts}"] = dict(
                    n=len(members), same_block_k=all(same_k), all=all(same)
                )
            dec = [r for r in rows_out[1:] if r["decode"]]
            best = min(dec, key=lambda r: sum(r["us"][m] for m in rows))
            best64 = min(
                (r for r in dec if r["tile"].startswith("m64")),
                key=lambda r: sum(r["us"][m] for m in rows),
                default=best,
            )
            fill = min(rows_out, key=lambda r: r["us"][args.prefill])
            entry = dict(
                shape=[n, k],
                kind=kind,
                example=nm,
                default=rows_out[0],
                best=best,
                best_m64=best64,
                best_prefill=fill,
                bits_agree=agree,
                all=rows_out,
            )
            report.append(entry)
            print(f"{n}x{k} {kind} ({nm}); bits: {agree}", flush=True)
            for r in (rows_out[0], best, best64, fill):
                print(
                    f"  {r['tile']:>20}{' (default)' if r['default'] else '':10} "
                    + " ".join(
                        f"{m}:{r['us'][m]:7.1f}" for m in [*rows, args.prefill] if m in r["us"]
                    )
                )
    print(
        json.dumps(
            {
                "bench": "tune_linears",
                "config": args.config,
                "rows": rows,
                "prefill": args.prefill,
                "shapes": report,
            }
        )
    )


if __name__ == "__main__":
    main()
