"""The FP8 products of a prompt (issue 34's prefill): Flash Next's FP8 linears and grouped
experts at 2,048 and 8,192 rows, run as prompt rows (kernels/row_kind.py: activations in
block FP8, e4m3 x e4m3 on wgmma, with the activations' quantization) and as decode rows (bf16
activations on mma.sync, how every prompt row ran before bf5fd6f), each call's time and its
rate against the e4m3 matrix rate measured in the same run (torch._scaled_mm), and how far
the prompt rows' output lies from the decode rows' (relative to its largest value).

    python benchmarks/fp8_prompt_rows.py [--rows 2048,8192]

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
    print(json.dumps(dict(bench="fp8_prompt_rows", device=device, fp8_flops=rate, rows=out)))


if __name__ == "__main__":
    main()
