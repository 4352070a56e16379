"""Decode time of each of the model's linear shapes and of its MoE block, one shape at a time:
which products hold the lone step's linear time (issue 9: 1.76 ms of 3.17 a token on the
H200 at 1d83ee2, 114 calls).

    python benchmarks/bench_linears.py --device cuda [--config flashnext-12l] [--rows 1,4,16]

The model is a random preset given its kernels (so the linears that share an input are
stacked, as in the engine). Each shape's weight is the model's own; its input random rows.
On CUDA `--calls` back-to-back calls are captured in one graph and timed between events
(launch cost included as a graph pays it, host cost not); on the CPU they run eagerly. A
shape's GB/s counts its weight bytes; `of copy` is that against a measured device copy (read
+ write). `ms a token` weighs one row's time by the shape's calls a decode token (every layer
that has it; the lm_head once). Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter

import torch

from flashlane.kernels import select_kernels
from flashlane.kernels.pdl import enabled as pdl_enabled
from flashlane.models.layers.norms import Linear, Stacked
from flashlane.models.presets import preset
from flashlane.models.random_weights import build_random


def timed(fn, device: str, calls: int) -> float:
    """Seconds a call of fn(), as `calls` calls in one CUDA graph (eagerly on the CPU)."""
    fn()
    if device != "cuda":
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t) / calls
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / (3 * calls)


def products(model) -> dict[tuple, tuple[torch.Tensor, str, int]]:
    """(N, K, kind) -> (a weight of that shape, a name, calls a decode token)."""
    found: dict[tuple, tuple[torch.Tensor, str, int]] = {}
    count: Counter = Counter()
    stacked = set()
    for name, m in model.named_modules():
        if name.startswith("mtp"):
            continue  # drafts off: the head does not run at decode
        for attr, v in vars(m).items():
            if isinstance(v, Stacked) and v.weight is not None:
                stacked.update(id(x) for x in v.linears)
                key = (*v.weight.shape, "stacked")
                found.setdefault(key, (v.weight, f"{name}.{attr}", 0))
                count[key] += 1
    for name, m in model.named_modules():
        if name.startswith("mtp") or not isinstance(m, Linear) or id(m) in stacked:
            continue
        kind = "router fp32" if name.endswith("mlp.gate") else "plain"
        key = (*m.weight.shape, kind)
        found.setdefault(key, (m.weight, name, 0))
        count[key] += 1
    return {k: (w, n, count[k]) for k, (w, n, _) in found.items()}


def product(kernels, x: torch.Tensor, w: torch.Tensor, kind: str):
    """The call the model makes: the router's fp32 products (from bf16 inputs in the Triton
    linear, after conversions in the reference), else the plain product."""
    if kind != "router fp32":
        return lambda: kernels.linear(x, w)
    if kernels.name == "triton":
        return lambda: kernels.linear(x, w, out_dtype=torch.float32)
    return lambda: kernels.linear(x.float(), w.float())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="flashnext-12l")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rows", default="1,4,16")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument(
        "--pdl",
        action="store_true",
        help="also time each linear at the first row count with programmatic "
        "dependent launch switched the other way (kernels/pdl.py, "
        "FLASHLANE_PDL; CUDA only)",
    )
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    pdl_on = pdl_enabled()
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    cfg, model = build_random(preset(args.config), dtype, args.device, 0)
    kernels = select_kernels(args.device)
    model.use_kernels(kernels)
    src = torch.empty(256 << 20, dtype=torch.uint8, device=args.device)
    dst = torch.empty_like(src)
    copy_bps = 2 * src.numel() / timed(lambda: dst.copy_(src), args.device, 5)
    src = dst = None
    table = []
    with torch.no_grad():
        for (n, k, kind), (w, name, per_token) in sorted(products(model).items()):
            us = {}
            for m in rows:
                x = torch.randn(m, k, device=args.device).to(w.dtype)
                us[m] = 1e6 * timed(product(kernels, x, w, kind), args.device, args.calls)
            gbps = w.numel() * w.element_size() / (us[rows[0]] / 1e6) / 1e9
            table.append(
                dict(
                    shape=[n, k],
                    kind=kind,
                    example=name,
                    per_token=per_token,
                    us=us,
                    gbps=gbps,
                    of_copy=gbps * 1e9 / copy_bps,
                    ms_a_token=per_token * us[rows[0]] / 1e3,
                )
            )
            if args.pdl and args.device == "cuda":
                x = torch.randn(rows[0], k, device=args.device).to(w.dtype)
                was = os.environ.get("FLASHLANE_PDL", "1")
                os.environ["FLASHLANE_PDL"] = "0" if pdl_on else "1"
                try:
                    other = 1e6 * timed(product(kernels, x, w, kind), args.device, args.calls)
                finally:
                    os.environ["FLASHLANE_PDL"] = was
                table[-1]["us_other_pdl"] = {rows[0]: other}
        moe = model.layers[0].mlp
        e = moe.experts
        us = {}
        for m in rows:
            x = torch.randn(m, cfg.hidden_size, device=args.device).to(dtype)
            us[m] = 1e6 * timed(
                lambda x=x: kernels.moe(
                    x,
                    moe.gate.weight,
                    e.gate_proj,
                    e.up_proj,
                    e.down_proj,
                    cfg.num_experts_per_tok,
                    cfg.norm_topk_prob,
                ),
                args.device,
                args.calls,
            )
        table.append(
            dict(
                shape=list(e.gate_proj.shape),
                kind="moe routed (route+experts)",
                example="layers.0.mlp",
                per_token=len(model.layers),
                us=us,
                ms_a_token=len(model.layers) * us[rows[0]] / 1e3,
            )
        )
    table.sort(key=lambda r: -r["ms_a_token"])
    print(f"copy bandwidth (read + write): {copy_bps / 1e9:.0f} GB/s; rows {rows}")
    print(
        f"{'shape':>16} {'kind':>14} {'calls':>5} "
        + " ".join(f"{f'us@{m}':>8}" for m in rows)
        + f" {'GB/s':>7} {'of copy':>7} {'ms/token':>8}  example"
    )
    for r in table:
        gb = f"{r['gbps']:7.0f} {r['of_copy']:7.0%}" if "gbps" in r else f"{'':7} {'':7}"
        print(
            f"{'x'.join(map(str, r['shape'])):>16} {r['kind'][:14]:>14} {r['per_token']:>5} "
            + " ".join(f"{r['us'][m]:8.1f}" for m in rows)
            + f" {gb} {r['ms_a_token']:8.3f}  {r['example']}"
        )
    for r in table:
        if "us_other_pdl" in r:
            other = r["us_other_pdl"][rows[0]]
            print(
                f"{'x'.join(map(str, r['shape'])):>16} PDL {'off' if pdl_on else 'on'} at "
                f"{rows[0]} row(s): {other:7.1f} us ({r['us'][rows[0]] / other:.2f}x)"
            )
    total = sum(r["ms_a_token"] for r in table)
    print(f"all of these at {rows[0]} row(s): {total:.3f} ms a token")
    print(
        json.dumps(
            {
                "bench": "linears",
                "config": args.config,
                "device": args.device,
                "pdl": pdl_on,
                "copy_gbps": copy_bps / 1e9,
                "rows": rows,
                "table": table,
                "ms_a_token": total,
            }
        )
    )


if __name__ == "__main__":
    main()
