"""Where a lone step's GPU time goes, plain against drafted (a GPU diagnostic of issue 28's
drafting at 16 streams): bench_lanes_cpu.py's batch at --streams, greedy, replies of
--tokens; one pass with plain steps only and one with drafted steps forced at --depth, each
under torch.profiler less a pass of the same prompts that stops at the first token (the
prompt round). Prints each kernel's GPU us a step on both sides, the sum of kernel time a
step beside the wall ms a step the driver measured (their gap: the time the graph's
launches leave the GPU idle), and one JSON line.

    python benchmarks/step_kernels.py --device cuda --streams 16 [--depth 2]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

import torch
from bench_lanes_cpu import prompts
from torch.profiler import ProfilerActivity, profile

from flashlane.llm import LLM
from flashlane.request import SamplingParams


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def kernel_us(llm: LLM, batch, params) -> tuple[Counter, Counter]:
    """GPU us by kernel name over one generate (CUDA kernels only), and their launches."""
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        llm.generate(batch, params)
        sync()
    us, calls = Counter(), Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            us[e.name] += e.device_time
            calls[e.name] += 1
    return us, calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda (default; the profiler's kernels)")
    ap.add_argument("--streams", type=int, default=16, help="replies at once (default: 16)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens a reply (default: 64)")
    ap.add_argument("--depth", type=int, default=2, help="the drafted side's (default: 2)")
    ap.add_argument("--top", type=int, default=30, help="kernels printed (default: 30)")
    args = ap.parse_args()
    llm = LLM(None, parallel=args.streams, device=args.device)
    lone = llm.engine.host.lone
    drafting = lone.drafting
    batch = prompts(llm, args.streams)
    kw = dict(temperature=0.0, ignore_eos=True)
    first = SamplingParams(max_tokens=1, draft=False, **kw)
    sides = {
        "plain": SamplingParams(max_tokens=args.tokens, draft=False, **kw),
        "drafted": SamplingParams(max_tokens=args.tokens, **kw),
    }
    drafting.depth = args.depth
    drafting.choose = lambda ids, *rest: args.depth
    for _ in range(2):  # untimed: compiles, captures
        for params in [first, *sides.values()]:
            llm.generate(batch, params)
    base_us, base_calls = kernel_us(llm, batch, first)
    out = {}
    for name, params in sides.items():
        steps0 = lone.num_steps
        us, calls = kernel_us(llm, batch, params)
        us.subtract(base_us)
        calls.subtract(base_calls)
        steps = max(1, lone.num_steps - steps0)
        depth = args.depth if name == "drafted" else 0
        out[name] = dict(
            steps=steps,
            kernel_us_a_step=sum(v for v in us.values() if v > 0) / steps,
            launches_a_step=sum(v for v in calls.values() if v > 0) / steps,
            step_ms=lone.step_ms.get((args.streams, depth)),
            kernels={k: round(v / steps, 2) for k, v in us.most_common(args.top) if v > 0},
        )
    names = list(dict.fromkeys([*out["drafted"]["kernels"], *out["plain"]["kernels"]]))
    print(f"{'kernel':<48} {'plain us':>9} {'drafted us':>10}")
    for k in names[: args.top]:
        p, d = out["plain"]["kernels"].get(k, 0.0), out["drafted"]["kernels"].get(k, 0.0)
        print(f"{k[:48]:<48} {p:>9.2f} {d:>10.2f}")
    for name, o in out.items():
        print(
            f"{name}: {o['steps']} steps, {o['launches_a_step']:.1f} launches and "
            f"{o['kernel_us_a_step']:.1f} us of kernels a step; the driver's step_ms {o['step_ms']}"
        )
    print(json.dumps(dict(bench="step_kernels", streams=args.streams, depth=args.depth, **out)))


if __name__ == "__main__":
    main()
