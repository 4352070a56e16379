"""The FP8 products of a prompt (issue 34's prefill): Flash Next's FP8 linears and grouped
experts at 2,048 and 8,192 rows, run as prompt rows (kernels/row_kind.py: activations in
block FP8, e4m3 x e4m3 on wgmma, with the activations' quantization) and as decode rows (bf16
activations on mma.sync, how every prompt row ran before bf5fd6f), each call's time and its
rate against the e4m3 matrix rate measured in the same run (torch._scaled_mm), and how far
the prompt rows' output lies from the decode rows' (relative to its largest value).

    python benchmarks/fp8_prompt_rows.py [--rows 2048,8192]
    python benchmarks/fp8_prompt_rows.py --tiles [--rows 8192]     # prompt tiles swept

`--tiles` times each product as prompt rows in other tiles (TILES, MOE_TILES: prompt rows'
bits are their own, so any fixed tile may become theirs) and says whether each gives the
default tile's bits.

GPU only for the figures; `--small` runs tiny shapes on any machine (through the interpreter
on the CPU) to check the script. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from functools import partial

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.tune_fp8_decode import random_fp8
from flashlane.bench.common import cuda_timed
from flashlane.kernels import row_kind
from flashlane.kernels.linear import triton_fp8 as lin
from flashlane.kernels.moe import triton_fp8 as moe
from flashlane.roofline import measure_ceilings

# (N, K) of Flash Next's FP8 linears in a prefill (tune_fp8_decode.LINEARS)
LINEARS = {
    "gdn in_proj qkv+z": (16384, 2560),
    "attn q_proj": (12288, 2560),
    "gdn / attn out_proj": (2560, 6144),
}
EXPERTS = (512, 640, 2560, 10)  # E routed, I, H, top_k (the shared expert one more)
SMALL = ({"small": (130, 300)}, (6, 136, 160, 3))
# prompt tiles of the linear to sweep (BLOCK_N divides the scale block, 128); one_part: every
# K block in one loop, else the decode rows' partitions of (N, K). None spills in its sm_90
# code at 2560 x 6144 (compiled on the CPU, 2026-12-05); these did and are left out: 128 x
# 128 on 4 warps (727 local stores), 128 x 64 on 4 (51), 128 x 128 on 8 with the
# partitions (4-5), 256 x 128 on 8 (150)
TILES = [
    dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st, one_part=one)
    for bm, bn, w, st, one in (
        (64, 128, 8, 3, False), (64, 128, 8, 4, False), (64, 128, 8, 3, True),
        (64, 128, 8, 4, True), (64, 128, 4, 4, True), (128, 64, 8, 4, True),
        (128, 128, 8, 3, True), (128, 128, 8, 4, True), (128, 128, 8, 5, True),
    )
]  # fmt: skip
# the MoE's prompt tiles (its rows in blocks of PROMPT_BLOCK_M pairs): gate-up, down; none
# spills in its sm_90 code (2026-12-05)
MOE_TILES = [
    (dict(BLOCK_N=gn, num_warps=gw, num_stages=gs, BLOCK_MAJOR=True),
     dict(BLOCK_N=dn, num_warps=dw, num_stages=ds, BLOCK_MAJOR=True))
    for (gn, gw, gs), (dn, dw, ds) in (
        ((64, 4, 3), (128, 4, 3)), ((64, 8, 3), (128, 8, 3)), ((128, 8, 3), (128, 8, 3)),
        ((64, 4, 4), (128, 4, 4)), ((128, 8, 4), (128, 8, 4)), ((32, 4, 4), (64, 4, 4)),
    )
]  # fmt: skip


def timed(fn, device: str, reps: int) -> float:
    """Seconds a call: the median of `reps` between CUDA events (bench.common.cuda_timed), or
    one call on the host's clock on the CPU (--small: the script's check), after a warm
    call."""
    if device == "cuda":
        return cuda_timed(fn, reps)
    fn()
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def apart(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30)).item()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="2048,8192", help="rows a call (default 2048,8192)")
    ap.add_argument("--reps", type=int, default=5, help="timed calls, the median (default 5)")
    ap.add_argument("--small", action="store_true", help="tiny shapes, any device (default off)")
    ap.add_argument("--tiles", action="store_true", help="sweep prompt tiles (default off)")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    linears, (e, i, h, k) = SMALL if args.small else (LINEARS, EXPERTS)
    rows = [16, 40] if args.small else [int(r) for r in args.rows.split(",")]
    g = torch.Generator(device=device).manual_seed(0)
    rate = measure_ceilings(device, fp8=True).get("fp8_flops") if device == "cuda" else None
    out = []
    print(f"{'product':<22} {'rows':>6} {'prompt us':>10} {'decode us':>10} {'prompt TF/s':>12}"
          f" {'of e4m3':>8} {'apart':>8}")  # fmt: skip
    weights = {name: random_fp8(shape, device, g) for name, shape in linears.items()}
    router = torch.randn(e + 1, h, generator=g, device=device).to(dtype) * h**-0.5
    stacks = [random_fp8(shape, device, g) for shape in ((e + 1, i, h),) * 2 + ((e + 1, h, i),)]
    for m in rows:
        calls = {}
        for name, w in weights.items():
            xm = torch.randn(m, w.shape[1], generator=g, device=device).to(dtype)
            calls[name] = (partial(lin.linear, xm, w), 2.0 * m * w.shape[0] * w.shape[1])
        xe = torch.randn(m, h, generator=g, device=device).to(dtype)
        experts = partial(moe.moe_shared, xe, router, *stacks, k, True)
        calls["experts"] = (experts, 2.0 * m * (k + 1) * 3 * i * h)
        for name, (call, flops) in calls.items():
            with row_kind.uniform(True):
                t_prompt = timed(call, device, args.reps)
                y_prompt = call()
            with row_kind.uniform(False):
                t_decode = timed(call, device, args.reps)
                y_decode = call()
            tf = flops / t_prompt / 1e12
            of = flops / t_prompt / rate if rate else None
            row = dict(product=name, rows=m, prompt_us=t_prompt * 1e6, decode_us=t_decode * 1e6,
                       prompt_tflops=tf, of_fp8_matrix_rate=of, apart=apart(y_prompt, y_decode))  # fmt: skip
            out.append(row)
            shown = f"{of:8.1%}" if of else f"{'-':>8}"
            print(f"{name:<22} {m:>6} {t_prompt * 1e6:>10.1f} {t_decode * 1e6:>10.1f} {tf:>12.1f}"
                  f" {shown} {row['apart']:>8.1e}")  # fmt: skip
            if args.tiles:
                row["tiles"] = sweep(name, call, y_prompt, flops, weights.get(name), device, args)
    print(json.dumps(dict(bench="fp8_prompt_rows", device=device, fp8_flops=rate, rows=out)))


def sweep(name, call, want, flops, w, device, args) -> list[dict]:
    """The product as prompt rows in each tile of TILES (a linear: w given) or MOE_TILES:
    us a call, TF/s, and whether its output has the default tile's bits."""
    got = []
    for tile in TILES if w is not None else MOE_TILES:
        if w is not None:
            x = call.args[0]
            n, k = w.shape
            base = lin.fp8_tile(x.shape[0], n, k, prompt=True)
            parts = (1, -(-k // base["BLOCK_K"])) if tile["one_part"] else lin.fp8_parts(n, k)
            cfg = dict(base, **{a: b for a, b in tile.items() if a != "one_part"})
            cfg.update(PARTS=parts[0], BLOCKS_PER_PART=parts[1])
            fn = partial(lin.linear_fp8, x, w, cfg)
            label = (f"{tile['BLOCK_M']}x{tile['BLOCK_N']} w{tile['num_warps']} "
                     f"s{tile['num_stages']}{' one part' if tile['one_part'] else ''}")  # fmt: skip
        else:
            gu, dn = tile

            def fn(gu=gu, dn=dn):
                old = moe.GATE_UP_PROMPT, moe.DOWN_PROMPT
                moe.GATE_UP_PROMPT, moe.DOWN_PROMPT = gu, dn
                try:
                    return call()
                finally:
                    moe.GATE_UP_PROMPT, moe.DOWN_PROMPT = old

            label = (f"gu {gu['BLOCK_N']} w{gu['num_warps']} s{gu['num_stages']}, "
                     f"down {dn['BLOCK_N']} w{dn['num_warps']} s{dn['num_stages']}")  # fmt: skip
        try:
            with row_kind.uniform(True):
                t = timed(fn, device, args.reps)
                same = bool(torch.equal(fn(), want))
        except Exception as err:  # a tile that does not compile or fit: say so, go on
            print(f"    {label:<36} failed: {type(err).__name__}: {str(err)[:80]}")
            got.append(dict(tile=label, error=f"{type(err).__name__}"))
            continue
        got.append(dict(tile=label, us=t * 1e6, tflops=flops / t / 1e12, same_bits=same))
        print(f"    {label:<36} {t * 1e6:>10.1f} us {flops / t / 1e12:>8.1f} TF/s"
              f"  {'same bits' if same else 'OTHER BITS'}")  # fmt: skip
    return got


if __name__ == "__main__":
    main()
