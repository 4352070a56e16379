"""Which tile choices give the FP8 linear other bits (the H200's row-invariance failures of
tests/kernels/test_triton_fp8.py at (2560, 2560), (640, 6144), (16480, 2560) in bf16).

For each (N, K): 200 rows through fp8_tile's own choice and through tiles forced to each
shape (split or in one program), against 16-row calls on the decode tile; prints how many
elements differ and, for the first, the exact float64 value of the sums. And the e4m3 codes
converted in the kernel (an identity product in bf16 on each tile) against torch's. Then the
same question for the bf16 kernels of the default path (`--bf16`): the dense linear and the
MoE over 2,048 rows, every row's bits in one call against 16-row calls.

    python benchmarks/fp8_bits_probe.py [--device cuda]
"""

from __future__ import annotations

import argparse

import torch

from flashlane.kernels.linear import triton_fp8 as tfp8
from flashlane.kernels.linear.fp8 import Fp8Weight
from flashlane.models.fp8 import quantize_blocks

SHAPES = {
    "16x64 s4": dict(BLOCK_M=16, BLOCK_N=64, num_warps=4, num_stages=4),
    "64x128 s3": dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=3),
    "64x64 s4": dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=4),
    "16x128 s3": dict(BLOCK_M=16, BLOCK_N=128, num_warps=4, num_stages=3),
    "32x64 s4": dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=4),
    "64x128 s1": dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=1),
    "64x128 w8": dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=3),
}


def weight(n, k, device):
    g = torch.Generator().manual_seed(6)
    w = torch.randn(n, k, generator=g) * 2.0 ** torch.randint(-8, 9, (n, 1), generator=g).float()
    q, s = quantize_blocks(w)
    return Fp8Weight(q.to(device), s.to(device))


def probe(n, k, rows, device, dtype):
    w = weight(n, k, device)
    g = torch.Generator(device=device).manual_seed(5)
    x = torch.randn(rows, k, generator=g, device=device).to(dtype)
    dec = torch.cat([tfp8.linear(x[i : i + 16], w) for i in range(0, rows, 16)])
    auto = tfp8.linear(x, w)
    print(f"({n}, {k}) {dtype}: fp8_tile(200) = {tfp8.fp8_tile(rows, n, k)}")
    print(f"  auto tile: {(auto != dec).sum().item()} of {dec.numel()} differ from 16-row calls")
    base = tfp8.fp8_tile(rows, n, k)
    for name, shape in SHAPES.items():
        for split in (True, False):
            try:
                y = tfp8.linear(x, w, tile=dict(base, **shape, SPLIT=split))
            except Exception as err:  # a shape this GPU cannot compile
                print(f"  {name:10s} split={split:d}: {type(err).__name__}")
                continue
            bad = (y != dec).nonzero()
            line = f"  {name:10s} split={split:d}: {len(bad)} differ"
            if len(bad):
                r, c = bad[0].tolist()
                line += f", first [{r}, {c}]: {y[r, c].item()!r} vs {dec[r, c].item()!r}"
                line += f" (float64 {exact(x[r], w, c):.10g})"
            print(line)


def exact(xrow, w, c):
    return (xrow.double() @ w.dequantize(torch.float64)[c]).item()


def codes(device):
    raw = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    fin = raw[raw.float().isfinite()]
    n = fin.numel()
    w = Fp8Weight(fin.reshape(n, 1).repeat(1, 128).contiguous().to(device),
                  torch.ones((n + 127) // 128, 1, device=device))  # fmt: skip
    want = fin.to(torch.bfloat16).float().to(device)
    for rows in (1, 65, 200):
        x = torch.zeros(rows, 128, dtype=torch.bfloat16, device=device)
        x[:, 0] = 1
        y = tfp8.linear(x, w).float()
        print(f"  e4m3 codes via a {rows}-row bf16 call: {(y != want).sum().item()} differ")


def bf16(device):
    """The bf16 linear and MoE (the default path's kernels): 2,048 rows in one call (prefill
    tiles) against 16-row calls (decode tiles), every element compared."""
    from flashlane.kernels.linear import triton as dense_tr
    from flashlane.kernels.moe import triton as moe_tr

    g = torch.Generator(device=device).manual_seed(11)
    rows = 2048
    for n, k in [(2560, 2560), (640, 6144), (16480, 2560)]:
        x = torch.randn(rows, k, generator=g, device=device).bfloat16()
        w = (torch.randn(n, k, generator=g, device=device) * k**-0.5).bfloat16()
        full = dense_tr.linear(x, w)
        parts = torch.cat([dense_tr.linear(x[i : i + 16], w) for i in range(0, rows, 16)])
        print(f"  bf16 linear ({n}, {k}): {(full != parts).sum().item()} of {full.numel()} differ")
    h, e, i, top = 2560, 64, 640, 10
    x = torch.randn(rows, h, generator=g, device=device).bfloat16()
    router = torch.randn(e, h, generator=g, device=device).bfloat16()
    gate, up = (
        (torch.randn(e, i, h, generator=g, device=device) * h**-0.5).bfloat16() for _ in "gu"
    )
    down = (torch.randn(e, h, i, generator=g, device=device) * i**-0.5).bfloat16()
    full = moe_tr.moe(x, router, gate, up, down, top, True)
    parts = torch.cat(
        [moe_tr.moe(x[r : r + 16], router, gate, up, down, top, True) for r in range(0, rows, 16)]
    )
    print(f"  bf16 MoE ({h}, {e} x {i}, top {top}): {(full != parts).sum().item()} differ")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--bf16", action="store_true", help="only the bf16 kernels' check")
    a = ap.parse_args()
    if a.bf16:
        return bf16(a.device)
    dtype = torch.bfloat16 if a.device.startswith("cuda") else torch.float32
    codes(a.device)
    dims = [(2560, 2560), (640, 6144)] if a.device.startswith("cuda") else [(70, 300)]
    for n, k in dims:
        probe(n, k, 200 if a.device.startswith("cuda") else 48, a.device, dtype)


if __name__ == "__main__":
    main()
