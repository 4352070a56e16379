"""Where a GPU round's time goes: torch.profiler over a prefill and decode rounds of a random
preset (kernels by GPU time, ops by host time, launches per round). A diagnosis tool, not a
benchmark: it prints tables and no JSON.

    python benchmarks/profile_gpu.py --config flashnext-4l
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch
from torch.profiler import ProfilerActivity, profile

from flashlane.bench.common import FLAT_COSTS, random_prompts
from flashlane.config import EngineConfig
from flashlane.engine import Engine
from flashlane.engine_plan import table_dtype_for
from flashlane.llm import LLM
from flashlane.models.config import ModelConfig
from flashlane.models.presets import preset
from flashlane.models.random_weights import build_random, random_table_place
from flashlane.request import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="flashnext-4l")
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("--rows", type=int, default=25)
    ap.add_argument(
        "--quantization", choices=["fp8"], help="the linears in block FP8 (as bench model's)"
    )
    ap.add_argument(
        "--context",
        type=int,
        default=0,
        help="positions a session holds (default: --prefill + 256): a decode step's cost "
        "against its sessions' size at the same length",
    )
    ap.add_argument(
        "--host",
        action="store_true",
        help="also cProfile the decode: Python functions by their own host time",
    )
    ap.add_argument(
        "--timeline",
        default="",
        help="write one decode step's kernels in order (name, grid, time, the "
        "gap before each) to this file, from the profiler's trace",
    )
    ap.add_argument(
        "--prefill-timeline",
        default="",
        help="write the prefill's kernels in order, and its largest idle gaps, to this file",
    )
    args = ap.parse_args()
    raw = preset(args.config)
    tables = random_table_place(raw, "cuda", args.quantization, None)
    # the n-gram tables in 8 bits where bf16 is over the host's share, as bench model's
    # default (the real model's 95 GiB tables on a host of 128 GiB)
    eight = table_dtype_for("auto", ModelConfig.from_hf(raw), tables, 2)
    q = args.quantization
    cfg, model = build_random(raw, torch.bfloat16, "cuda", 0, q, tables, table_dtype=eight)
    print(f"{args.config}: linears {q or 'bf16'}, n-gram tables on {tables} ({eight or 'bf16'})")
    config = EngineConfig.resolve(
        device="cuda",
        parallel=max(2, args.streams),
        context=max(args.context, args.prefill + 256),
        drafts=False,
        prompt_cache_gb=0,
    )
    llm = LLM.from_engine(Engine(config, costs=FLAT_COSTS, built=(cfg, model)))
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, draft=False)
    dec = SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True, draft=False)
    long = random_prompts(1, args.prefill, cfg.vocab_size, 1)
    short = random_prompts(args.streams, 64, cfg.vocab_size, 2)
    for _ in range(2):  # compile every kernel variant first
        t = time.perf_counter()
        llm.generate(long, one)
        llm.generate(short, dec)
        print(f"warm pass: {time.perf_counter() - t:.2f} s")
    for name, prompts, params in (("prefill", long, one), ("decode x8", short, dec)):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t = time.perf_counter()
            out = llm.generate(prompts, params)
            torch.cuda.synchronize()
            wall = time.perf_counter() - t
        st = out[0].stats
        print(
            f"\n=== {name}: wall {wall * 1e3:.1f} ms, prefill {st.prefill_seconds * 1e3:.1f} ms,"
            f" decode {st.decode_seconds * 1e3:.1f} ms"
        )
        ka = prof.key_averages()
        launches = sum(e.count for e in ka if e.key.startswith(("cudaLaunchKernel", "cuLaunch")))
        print(f"kernel launches: {launches}")
        print(ka.table(sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=60))
        print(
            ka.table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=60)
        )
        if name == "prefill" and args.prefill_timeline:
            _write_timeline(
                args.prefill_timeline,
                _trace_kernels(prof),
                f"the prefill of {args.prefill} tokens, wall {wall * 1e3:.1f} ms",
            )
    # decode alone: the kernels of a 9-token reply less those of a 1-token reply (its prompt)
    totals = []
    for tokens in (1, 9):
        params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True, draft=False)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            llm.generate(short, params)
            torch.cuda.synchronize()
        totals.append({e.key: (e.self_device_time_total, e.count) for e in prof.key_averages()})
    diff = {
        k: (t - totals[0].get(k, (0, 0))[0], n - totals[0].get(k, (0, 0))[1])
        for k, (t, n) in totals[1].items()
    }
    whole = sum(t for t, _ in diff.values())
    print(
        f"\n=== decode alone, 8 tokens of {args.streams} stream(s): GPU time {whole / 8e3:.3f} ms"
        " a token (kernels of 9 tokens less 1)"
    )
    for k, (t, n) in sorted(diff.items(), key=lambda kv: -kv[1][0])[: args.rows]:
        print(f"{t / 8e3:9.3f} ms {n / 8:7.1f} calls  {k[:90]}")
    if args.timeline:
        timeline(llm, short, args.timeline)
    if args.host:
        for name, prompts, params in (("decode", short, dec), ("prefill", long, one)):
            torch.cuda.synchronize()
            prof = cProfile.Profile()
            prof.enable()
            llm.generate(prompts, params)
            torch.cuda.synchronize()
            prof.disable()
            print(f"\n=== {name}, host: Python functions by own time (cProfile)")
            pstats.Stats(prof).sort_stats("tottime").print_stats(args.rows * 2)
            pstats.Stats(prof).sort_stats("cumulative").print_stats(args.rows * 2)


def _trace_kernels(prof) -> list[dict]:
    """The profiled GPU work (kernels, copies, sets) in start order, from the chrome trace."""
    import json
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        trace = os.path.join(d, "trace.json")
        prof.export_chrome_trace(trace)
        with open(trace) as f:
            events = json.load(f)["traceEvents"]
    return sorted(
        (e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
        key=lambda e: e["ts"],
    )


def _write_timeline(path: str, step: list[dict], title: str) -> None:
    """Each kernel's start, duration, the gap before it and the time it adds (its end less
    the latest end before it); then the largest idle gaps with the kernels around them."""
    busy = sum(e["dur"] for e in step)
    span = step[-1]["ts"] + step[-1]["dur"] - step[0]["ts"]
    idle = []
    with open(path, "w") as f:
        f.write(
            f"# {title}: {len(step)} kernels, busy {busy:.1f} us, span {span:.1f} us, "
            f"gaps {span - busy:.1f} us\n"
        )
        f.write(
            "# i  start_us   dur_us  gap_us  own_us  grid  name   (own: its end less the "
            "latest end before it, the time it adds to the step)\n"
        )
        prev = last = step[0]["ts"]
        for i, e in enumerate(step):
            grid = e.get("args", {}).get("grid", "")
            end = e["ts"] + e["dur"]
            f.write(
                f"{i:4d} {e['ts'] - step[0]['ts']:9.1f} {e['dur']:8.2f} "
                f"{e['ts'] - prev:7.2f} {max(0.0, end - last):7.2f}  {grid}  "
                f"{e['name'][:60]}\n"
            )
            if e["ts"] > last:
                idle.append((e["ts"] - last, i))
            prev, last = end, max(last, end)
        total = sum(g for g, _ in idle)
        f.write(f"# idle (no kernel running): {total:.1f} us in {len(idle)} gaps; largest:\n")
        for g, i in sorted(idle, reverse=True)[:25]:
            f.write(
                f"#   {g:9.1f} us before {i}: {step[i - 1]['name'][:40]} -> "
                f"{step[i]['name'][:40]}\n"
            )
    print(f"timeline: {len(step)} kernels, busy {busy:.1f} us, span {span:.1f} us -> {path}")


def timeline(llm, prompts, path: str) -> None:
    """The kernels of one decode step in order, from a 9-token reply's trace: the step is the
    last run of kernels as long as a step's share of the reply's kernels; busy is the sum
    of kernel times, span the first start to the last end."""
    params = SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True, draft=False)
    counts = []
    for tokens in (1, 9):
        p = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True, draft=False)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            llm.generate(prompts, p if tokens == 1 else params)
            torch.cuda.synchronize()
        counts.append(_trace_kernels(prof))
    per_step = (len(counts[1]) - len(counts[0])) // 8
    step = counts[1][-2 * per_step : -per_step]  # one whole step before the last
    _write_timeline(path, step, f"one decode step of {len(prompts)} stream(s)")


if __name__ == "__main__":
    main()
