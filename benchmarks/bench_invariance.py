"""What row invariance costs (issue 8): our row-invariant Triton GEMM and grouped MoE against
torch's paths (cuBLAS through F.linear; for the MoE, the torch reference: one cuBLAS GEMM
chain per routed expert over its rows, which reads the same experts), on Flash Next's shapes
at the row counts a round has. Also checks whether cuBLAS itself is row-invariant on those
shapes (a row alone against the same row among M).

    python benchmarks/bench_invariance.py --device cuda     # prints a table, then one JSON line

On the CPU (`--device cpu`) it runs the torch references only, to check the script.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime, timezone

import torch
import torch.nn.functional as F

from flashlane.bench.common import commit

# (name, N, K): the largest linears of a Flash Next layer (hidden 2560)
LINEARS = [
    ("attn q+gate", 2 * 24 * 256, 2560),
    ("attn o", 2560, 24 * 256),
    ("gdn qkv", 2 * 16 * 128 + 48 * 128, 2560),
    ("gdn out", 2560, 48 * 128),
    ("lm_head", 248320, 2560),
]
ROWS = [1, 4, 16, 64, 2048]
MOE = (2560, 512, 640, 10)  # hidden, experts, intermediate, top_k


def timed(fn, args: tuple, device: str, reps: int) -> float:
    """Median ms of `reps` calls of fn(*args), each synced (warmed twice first)."""
    fn(*args), fn(*args)
    out = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn(*args)
        if device == "cuda":
            torch.cuda.synchronize()
        out.append(1e3 * (time.perf_counter() - t))
    return sorted(out)[len(out) // 2]


def row_invariant(fn, x: torch.Tensor, w: torch.Tensor) -> bool:
    """fn(x, w)[i] == fn(x[i:i+1], w) bit for bit for the first, a middle and the last row."""
    full = fn(x, w)
    rows = {0, len(x) // 2, len(x) - 1}
    return all(torch.equal(fn(x[i : i + 1], w), full[i : i + 1]) for i in rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    dev = args.device
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    if dev == "cuda":
        from flashlane.kernels.linear.triton import linear as ours
        from flashlane.kernels.moe.reference import moe as torch_moe
        from flashlane.kernels.moe.triton import moe as ours_moe
    g = torch.Generator(device=dev).manual_seed(0)
    figures: dict[str, dict] = {}
    print(
        f"{'op':24s} {'rows':>5s} {'ours ms':>9s} {'torch ms':>10s} {'ratio':>6s} {'torch inv.':>11s}"
    )
    for name, n, k in LINEARS:
        w = torch.randn(n, k, generator=g, device=dev).to(dtype) * k**-0.5
        for m in ROWS if n < 100_000 else ROWS[:4]:
            x = torch.randn(m, k, generator=g, device=dev).to(dtype)
            base = timed(F.linear, (x, w), dev, args.reps)
            mine = timed(ours, (x, w), dev, args.reps) if dev == "cuda" else None
            inv = row_invariant(F.linear, x, w) if m > 1 else True
            figures[f"{name} M={m}"] = {
                "ours_ms": mine, "cublas_ms": base, "cublas_row_invariant": inv,
            }  # fmt: skip
            ratio = f"{mine / base:6.2f}" if mine else "     -"
            mine_s = f"{mine:9.3f}" if mine else "        -"
            print(f"{name:24s} {m:5d} {mine_s} {base:10.3f} {ratio} {inv!s:>11s}")
    if dev == "cuda":
        h, e, i, k = MOE
        gate = torch.randn(e, i, h, generator=g, device=dev).to(dtype) * h**-0.5
        up, down = gate.clone(), torch.randn(e, h, i, generator=g, device=dev).to(dtype) * i**-0.5
        router = torch.randn(e, h, generator=g, device=dev).to(dtype) * h**-0.5
        for m in ROWS:
            x = torch.randn(m, h, generator=g, device=dev).to(dtype)
            moe_args = (x, router, gate, up, down, k, True)
            mine = timed(ours_moe, moe_args, dev, args.reps)
            base = timed(torch_moe, moe_args, dev, args.reps)
            figures[f"moe M={m}"] = {"ours_ms": mine, "torch_per_expert_ms": base}
            print(
                f"{'moe (torch per expert)':24s} {m:5d} {mine:9.3f} {base:10.3f} "
                f"{mine / base:6.2f} {'-':>11s}"
            )
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    print(
        json.dumps(
            {
                "bench": "invariance",
                "device": name,
                "commit": commit(),
                "torch": torch.__version__,
                "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "command": f"python benchmarks/bench_invariance.py --device {dev}",
                "figures": figures,
            }
        )
    )


if __name__ == "__main__":
    main()
