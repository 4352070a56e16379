"""Tiles of the block-FP8 kernels at one decode row, or `--rows` of them (issue 34): the
linear (`linear_fp8`) and the grouped experts (`experts_fp8`, ten routed a row and the shared
expert) at Flash Next's per-layer shapes, each candidate's GPU time against the bytes it
must read, and whether candidates of the same partitions give the same bits as the default
tile.

    python benchmarks/tune_fp8_decode.py [--calls 64] [--rows 16]

Weights are cold as in a decode step: the calls of one timing cycle through copies of a
weight that together exceed the H200's 50 MB L2 (the experts: a different draw of ten a
call). Timing is `bench_linears.timed` (the calls in one CUDA graph between events). BLOCK_N,
warps and stages never change a product's sum (a K block of 128 is one dot from zero on
mma.sync, rows of 16, whichever tile holds it): the bit check shows it on these shapes;
PARTS does change it (fixed by N and K alone for decode rows: `fp8_tiles.decode_parts`).
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_linears import timed
from flashlane.kernels.linear import triton_fp8 as lin
from flashlane.kernels.linear.fp8 import BLOCK, FP8_DTYPE, Fp8Weight, scale_grid
from flashlane.kernels.moe import triton_fp8 as moe

# (N, K) of Flash Next's FP8 linears a decode step runs, and calls a layer
LINEARS = {
    "gdn in_proj qkv+z": (16384, 2560),
    "attn q_proj": (12288, 2560),
    "ple key_proj": (10240, 2560),
    "gdn / attn out_proj": (2560, 6144),
    "ple value_proj": (2560, 2560),
}
# experts: E routed + 1 shared, I, H, top_k
EXPERTS = (512, 640, 2560, 10)
L2_BYTES = 50 << 20


def random_fp8(shape, device, g) -> Fp8Weight:
    q = (torch.randn(shape, generator=g, device=device) * 64).clamp(-448, 448).to(FP8_DTYPE)
    s = torch.rand(scale_grid(shape), generator=g, device=device) * 1e-3 + 1e-4
    return Fp8Weight(q, s)


def nbytes(w: Fp8Weight) -> int:
    return w.q.numel() + 4 * w.scale_inv.numel()


def linear_candidates(n: int, k: int) -> list[dict]:
    out = []
    for bn, warps, stages, target in itertools.product((32, 64, 128), (4, 8), (3, 5), (264, 1056)):
        if bn < 128 and warps == 8:
            continue
        parts, per = lin.fp8_parts(n, k, target, bn)
        out.append(
            dict(BLOCK_M=16, BLOCK_N=bn, BLOCK_K=BLOCK, num_warps=warps, num_stages=stages,
                 PARTS=parts, BLOCKS_PER_PART=per, SPLIT=parts > 1, target=target)
        )  # fmt: skip
    return out


def tune_linears(calls: int, device: str, g, m: int = 1) -> list[dict]:
    rows = []
    for label, (n, k) in LINEARS.items():
        w0 = random_fp8((n, k), device, g)
        copies = [w0] + [
            random_fp8((n, k), device, g) for _ in range(max(1, -(-3 * L2_BYTES // nbytes(w0))))
        ]
        x = torch.randn(m, k, device=device, dtype=torch.bfloat16, generator=g)
        base = lin.fp8_tile(m, n, k)
        want = lin.linear_fp8(x, w0)

        def run(t, ws=copies, x=x):
            it = itertools.cycle(ws)
            return timed(lambda: lin.linear_fp8(x, next(it), t), device, calls)

        default_s = run(base)
        lin.BITS = False  # Triton's e4m3 conversion, for the record
        triton_s = run(base)
        same_cvt = bool(torch.equal(lin.linear_fp8(x, w0), want))
        lin.BITS = True
        print(f"\n{label} [{n} x {k}], {nbytes(w0) / 1e6:.1f} MB, default {_name(base)}: "
              f"{default_s * 1e6:.1f} us, {nbytes(w0) / default_s / 1e12:.2f} TB/s "
              f"(Triton's conversion: {triton_s * 1e6:.1f} us, bits "
              f"{'==' if same_cvt else '!='})")  # fmt: skip
        rows.append(dict(kind="linear", shape=label, n=n, k=k, tile="default, Triton's cvt",
                         us=triton_s * 1e6, TBps=nbytes(w0) / triton_s / 1e12,
                         default_us=default_s * 1e6, same_parts=True,
                         bits_equal=same_cvt))  # fmt: skip
        for t in linear_candidates(n, k):
            tile = {key: v for key, v in t.items() if key != "target"}
            try:
                s = run(tile)
                same = bool(torch.equal(lin.linear_fp8(x, w0, tile), want))
            except Exception as e:  # a tile Triton cannot build: said, then skipped
                print(f"  {_name(t)}: failed ({type(e).__name__}: {str(e)[:80]})")
                continue
            rows.append(dict(kind="linear", shape=label, n=n, k=k, tile=_name(t), us=s * 1e6,
                             TBps=nbytes(w0) / s / 1e12, default_us=default_s * 1e6,
                             same_parts=t["PARTS"] == base["PARTS"], bits_equal=same))  # fmt: skip
        best = sorted((r for r in rows if r["shape"] == label), key=lambda r: r["us"])[:5]
        for r in best:
            print(f"  {r['tile']:44s} {r['us']:7.1f} us {r['TBps']:5.2f} TB/s "
                  f"bits {'==' if r['bits_equal'] else '!='} default")  # fmt: skip
    return rows


def tune_experts(calls: int, device: str, g, m: int = 1) -> list[dict]:
    e, i, h, top_k = EXPERTS
    gate, up = random_fp8((e + 1, i, h), device, g), random_fp8((e + 1, i, h), device, g)
    down = random_fp8((e + 1, h, i), device, g)
    x = torch.randn(m, h, device=device, dtype=torch.bfloat16, generator=g)
    # each row its own draw of top_k experts (random weights route evenly)
    draws = [torch.stack([torch.randperm(e, generator=g, device=device)[:top_k]
                          for _ in range(m)]) for _ in range(calls)]  # fmt: skip
    weights = torch.softmax(torch.randn(m, top_k, device=device, generator=g), -1)
    weights = weights.to(torch.bfloat16)
    logit = torch.zeros(m, 1, device=device, dtype=torch.bfloat16)
    # bytes a call reads: the distinct experts its rows picked (a mean over the draws) and
    # the shared one, each with its scales
    picked = sum(d.unique().numel() for d in draws) / len(draws)
    read = (picked + 1) * 3 * i * h * (1 + 4 / BLOCK / BLOCK)
    rows = []

    def call(ids):
        return moe.experts_fp8(x, weights, ids, gate, up, down, shared_logit=logit)

    want = call(draws[0])
    for bits in (True, False):  # the defaults with each e4m3 conversion
        lin.BITS = bits
        it = itertools.cycle(draws)
        s = timed(lambda it=it: call(next(it)), device, calls)
        same = bool(torch.equal(call(draws[0]), want))
        rows.append(dict(kind="experts", which="default" if bits else "default, Triton's cvt",
                         tile={}, us=s * 1e6, TBps=read / s / 1e12, bits_equal=same))  # fmt: skip
        print(f"experts, default tiles, {'by bits' if bits else 'Triton'}: {s * 1e6:.1f} us, "
              f"{read / s / 1e12:.2f} TB/s, bits {'==' if same else '!='}")  # fmt: skip
    lin.BITS = True
    saved = dict(moe.GATE_UP_TILE), dict(moe.DOWN_TILE)
    for which, bns in (("gate_up", (16, 32, 64)), ("down", (32, 64, 128))):
        for bn, warps, stages in itertools.product(bns, (4, 8), (2, 4, 6)):
            if bn < 64 and warps == 8:
                continue
            tile = dict(BLOCK_N=bn, num_warps=warps, num_stages=stages)
            moe.GATE_UP_TILE, moe.DOWN_TILE = dict(saved[0]), dict(saved[1])
            (moe.GATE_UP_TILE if which == "gate_up" else moe.DOWN_TILE).update(tile)
            it = itertools.cycle(draws)
            try:
                s = timed(lambda it=it: call(next(it)), device, calls)
                same = bool(torch.equal(call(draws[0]), want))
            except Exception as ex:
                print(f"  {which} {tile}: failed ({type(ex).__name__}: {str(ex)[:80]})")
                continue
            rows.append(dict(kind="experts", which=which, tile=tile, us=s * 1e6,
                             TBps=read / s / 1e12, bits_equal=same))  # fmt: skip
    moe.GATE_UP_TILE, moe.DOWN_TILE = saved
    print(f"\nexperts: {m} rows of {top_k} routed + shared, I={i}, H={h}, {read / 1e6:.1f} MB a call; "
          f"defaults gate_up {saved[0]}, down {saved[1]}")  # fmt: skip
    for which in ("gate_up", "down"):
        for r in sorted((r for r in rows if r["which"] == which), key=lambda r: r["us"])[:5]:
            print(f"  {which:8s} {r['tile']!s:50s} {r['us']:7.1f} us (whole call) "
                  f"bits {'==' if r['bits_equal'] else '!='}")  # fmt: skip
    return rows


def _name(t: dict) -> str:
    return (f"16x{t['BLOCK_N']} w{t['num_warps']} s{t['num_stages']} parts {t['PARTS']}"
            f"x{t['BLOCKS_PER_PART']}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=64)
    ap.add_argument("--only", choices=["linear", "experts"], default=None)
    ap.add_argument("--rows", type=int, default=1, help="decode rows a call (1-16)")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="small shapes on the CPU (TRITON_INTERPRET=1): the script's own check",
    )
    args = ap.parse_args()
    global LINEARS, EXPERTS, L2_BYTES
    device = "cpu" if args.smoke else "cuda"
    if args.smoke:
        LINEARS, EXPERTS, L2_BYTES = {"small": (256, 512)}, (8, 128, 256, 2), 1 << 18
    elif not torch.cuda.is_available():
        raise SystemExit("tune_fp8_decode: needs an NVIDIA GPU")
    g = torch.Generator(device=device).manual_seed(0)
    rows = []
    if args.only in (None, "linear"):
        rows += tune_linears(args.calls, device, g, args.rows)
    if args.only in (None, "experts"):
        rows += tune_experts(args.calls, device, g, args.rows)
    differ = [r for r in rows if r.get("same_parts", True) and not r["bits_equal"]]
    print(f"\nsame partitions, other bits: {len(differ)} of "
          f"{sum(r.get('same_parts', True) for r in rows)}")  # fmt: skip
    name = "cpu (interpreter)" if args.smoke else torch.cuda.get_device_name()
    print(json.dumps(dict(bench="tune_fp8_decode", device=name, decode_rows=args.rows,
                          rows=rows)))  # fmt: skip


if __name__ == "__main__":
    main()
