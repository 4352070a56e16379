"""Keyed sampler speed (issue 4): the CPU fast path against the full computation, per row on
one core, and the device path for 16 rows in one call.

    python benchmarks/bench_sampler.py [--device cpu|cuda|all] [--repeats 200]

Named rows, 248,320 ids, seeded: 'peaked' is N(0, 2) logits with 8 ids raised by 12..18 (a
confident model: almost all mass on a few ids); 'flat' is N(0, 1) (mass over most of the
vocabulary). Each is drawn with top_p 0.95 (top_k 0), top_k 20, min_p 0.05 and greedy, T = 1,
plus 'plain' (T = 1, no filter) for reference. Every draw uses a new seed and position. The
device figure is the wall time of one draw_rows_gpu call on 16 such rows (tokens back on the
host), with its tokens checked against the CPU path. On CUDA that call runs triton_draw's fused
kernels for the rows they take (greedy, plain, min_p, top_k, top_p without top_k);
`--path torch` times the plain torch path instead. 'fused rows' counts the rows of a
batch the kernels settled. The first calls (Triton compiles each kernel once, seconds) are not
timed. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone

import numpy as np
import torch

from flashlane.request import SamplingParams
from flashlane.sampling.choose import DrawSpec, draw, draw_full, draw_rows
from flashlane.sampling.gpu import draw_rows_gpu

VOCAB = 248_320
PARAMS = {
    "top_p=0.95": SamplingParams(top_p=0.95),
    "top_k=20": SamplingParams(top_k=20),
    "min_p=0.05": SamplingParams(min_p=0.05),
    "greedy": SamplingParams(temperature=0.0),
    "plain": SamplingParams(),
}
GPU_TARGET_MS = 0.3


def named_rows(spread: str, num_rows: int, seed: int) -> torch.Tensor:
    """fp32 logits [num_rows, VOCAB] with the named spread."""
    gen = torch.Generator().manual_seed(seed)
    if spread == "flat":
        return torch.randn(num_rows, VOCAB, generator=gen)
    logits = torch.randn(num_rows, VOCAB, generator=gen) * 2.0
    for row in logits:
        row[torch.randint(0, VOCAB, (8,), generator=gen)] += torch.linspace(12.0, 18.0, 8)
    return logits


def percentiles(times_s: list[float]) -> tuple[float, float]:
    ms = np.array(times_s) * 1e3
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def time_cpu(fn, row: torch.Tensor, params: SamplingParams, repeats: int) -> list[float]:
    fn(row, DrawSpec(params, 1, 1))  # warm up
    times = []
    for i in range(repeats):
        spec = DrawSpec(params, 1000 + i, 5000 + i)
        start = time.perf_counter()
        fn(row, spec)
        times.append(time.perf_counter() - start)
    return times


def bench_cpu(repeats: int, full_repeats: int) -> dict:
    torch.set_num_threads(1)
    figures = {}
    print(f"CPU, one thread: ms per row (fast: {repeats} draws, full: {full_repeats})")
    heads = ("fast p50", "fast p99", "full p50", "full p99")
    print(f"{'row':<24}" + "".join(f"{h:>10}" for h in heads) + f"{'x p50':>8}")
    for spread in ("peaked", "flat"):
        row = named_rows(spread, 1, seed=0)[0]
        for name, params in PARAMS.items():
            fast = percentiles(time_cpu(draw, row, params, repeats))
            full = percentiles(time_cpu(draw_full, row, params, full_repeats))
            label = f"{spread}/{name}"
            figures[label] = dict(
                fast_p50_ms=fast[0],
                fast_p99_ms=fast[1],
                full_p50_ms=full[0],
                full_p99_ms=full[1],
                speedup_p50=full[0] / fast[0],
            )
            cols = f"{fast[0]:>10.3f}{fast[1]:>10.3f}{full[0]:>10.3f}{full[1]:>10.3f}"
            print(f"{label:<24}{cols}{full[0] / fast[0]:>8.1f}")
    return figures


def bench_device(dev: torch.device, repeats: int, path: str) -> dict:
    """draw_rows_gpu on `dev` (cuda; cpu only to try this function out)."""
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    use_fused = path == "fused" and dev.type == "cuda"
    batches = {
        f"{spread}/{name}": (named_rows(spread, 16, seed=1), [params] * 16)
        for spread in ("peaked", "flat")
        for name, params in PARAMS.items()
    }
    mixed = list(PARAMS.values()) * 4
    rows = torch.cat([named_rows("peaked", 8, seed=2), named_rows("flat", 8, seed=3)])
    batches["mixed"] = (rows, mixed[:16])
    no_top_p = [p for p in PARAMS.values() if p.top_p == 1.0] * 4
    batches["mixed, no top_p"] = (rows, no_top_p[:16])
    figures = {}
    print(f"\n{describe_device(dev.type)}, {path} path: ms per call of 16 rows, {repeats} calls")
    print(f"{'batch':<24}{'p50':>10}{'p99':>10}{'tokens == CPU':>15}{'fused rows':>12}")
    for label, (logits, params) in batches.items():
        logits = logits.to(dev)
        same, fused_rows = True, 0
        for i in range(3):  # also compiles the kernels; each check draws new keys
            specs = [DrawSpec(p, 77 + 100 * i + j, 900 + i) for j, p in enumerate(params)]
            got = draw_rows_gpu(logits, specs, fused=use_fused)
            same = same and got == draw_rows(logits.cpu(), specs)
        if use_fused:
            from flashlane.sampling.fused_draw import draw_rows_fused

            fused_rows = sum(t is not None for t in draw_rows_fused(logits, specs))
        times = []
        for i in range(repeats):
            specs = [DrawSpec(p, 1000 * i + j, 5000 + i) for j, p in enumerate(params)]
            sync()
            start = time.perf_counter()
            draw_rows_gpu(logits, specs, fused=use_fused)
            times.append(time.perf_counter() - start)
        p50, p99 = percentiles(times[3:])  # the first calls warm up caches and kernels
        figures[label] = dict(p50_ms=p50, p99_ms=p99, same_as_cpu=same, fused_rows=fused_rows)
        print(f"{label:<24}{p50:>10.3f}{p99:>10.3f}{same!s:>15}{fused_rows:>12}")
    print(f"target: p50 <= {GPU_TARGET_MS} ms per call of 16 rows")
    return figures


def describe_device(device: str) -> str:
    if device != "cpu" and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    try:
        with open("/proc/cpuinfo") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        return names[0] if names else platform.processor()
    except OSError:
        return platform.processor() or platform.machine()


def commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True)
        return out.stdout.decode().strip() or "unknown"
    except OSError:
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda", "all"], default="cpu")
    ap.add_argument("--repeats", type=int, default=200, help="fast-path draws / device calls")
    ap.add_argument("--full-repeats", type=int, default=30, help="full-computation draws")
    ap.add_argument("--path", choices=["fused", "torch"], default="fused", help="device path")
    args = ap.parse_args()
    if args.device != "cpu" and not torch.cuda.is_available():
        sys.exit("bench_sampler: --device cuda needs a CUDA GPU")
    figures = {}
    if args.device in ("cpu", "all"):
        figures["cpu"] = bench_cpu(args.repeats, args.full_repeats)
    if args.device in ("cuda", "all"):
        figures["cuda"] = bench_device(torch.device("cuda"), args.repeats, args.path)
    record = dict(
        bench="sampler",
        device=describe_device(args.device),
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        commit=commit(),
        command="python " + " ".join(sys.argv),
        torch=torch.__version__,
        figures=figures,
    )
    print(json.dumps(record))


if __name__ == "__main__":
    main()
