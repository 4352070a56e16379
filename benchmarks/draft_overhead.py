"""What drafting on costs where nothing drafts (issue 28: on / off 0.996 at 16 and 64 streams
on the H100, 166eee3, with no drafted step at either count): bench_lanes_cpu.py's batch at
each level, off and on interleaved pair by pair, the pass's wall and the host's time around
it, then one profiled pass of each side and the functions whose own host time differs most
between them (on minus off), with their calls, and Python's garbage collections in
the timed passes; on a GPU, one pass a side under torch's profiler and the kernels whose
launches or GPU time differ most. A function the on side alone calls is
drafting's bookkeeping; one called as often on both sides but slower points at the GPU
(a sync that waits longer) or at memory the on side holds.

    python benchmarks/draft_overhead.py --device cuda --streams 16,64 --pairs 9
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from statistics import median

import torch
from bench_lanes_cpu import drafting_counts, prompts, run
from round_split import host_profile
from step_kernels import kernel_us

from flashlane.llm import LLM
from flashlane.request import SamplingParams


class Collections:
    """Python's garbage collections while it is on: by generation, (count, ms)."""

    def __init__(self) -> None:
        self.seen: dict[int, list] = {}
        self.t0 = 0.0
        gc.callbacks.append(self)

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.t0 = time.perf_counter()
            return
        got = self.seen.setdefault(info["generation"], [0, 0.0])
        got[0] += 1
        got[1] += 1e3 * (time.perf_counter() - self.t0)

    def take(self) -> dict[int, list]:
        seen, self.seen = self.seen, {}
        return seen


def timed_pass(llm: LLM, batch, params: SamplingParams) -> tuple[float, float, list]:
    """One pass: (wall s, the process's CPU s, outputs)."""
    c0 = time.process_time()
    dt, outs = run(llm, batch, params)
    return dt, time.process_time() - c0, outs


def self_times(stats: dict) -> dict[str, tuple[int, float]]:
    """A profile's functions by name: (calls, own ms)."""
    got: dict[str, tuple[int, float]] = {}
    for (path, line, name), (_, nc, tt, _, _) in stats.items():
        where = path.rsplit("/flashlane/", 1)[-1] if "/flashlane/" in path else path
        key = f"{where.rsplit('/', 1)[-1]}:{line}:{name}"
        calls, ms = got.get(key, (0, 0.0))
        got[key] = (calls + nc, ms + tt * 1e3)
    return got


def differences(off: dict, on: dict, n: int) -> list[dict]:
    """The n functions whose own host time grew most from off to on, and any whose calls
    differ (drafting's bookkeeping), largest change first."""
    rows = []
    for key in set(off) | set(on):
        (c0, m0), (c1, m1) = off.get(key, (0, 0.0)), on.get(key, (0, 0.0))
        rows.append({"fn": key, "calls": [c0, c1], "ms": [round(m0, 3), round(m1, 3)]})
    rows.sort(key=lambda r: -(r["ms"][1] - r["ms"][0]))
    top = rows[:n]
    top += [r for r in rows[n:] if r["calls"][0] != r["calls"][1]][:n]
    return top


def gpu_differences(llm: LLM, batch, on, off, n: int) -> list[dict]:
    """One pass a side under torch's profiler: the kernels whose launches or GPU time differ
    most between off and on (the same work would give the same launches)."""
    (us0, calls0), (us1, calls1) = kernel_us(llm, batch, off), kernel_us(llm, batch, on)
    rows = [
        {
            "kernel": k[:80],
            "calls": [calls0[k], calls1[k]],
            "us": [round(us0[k], 1), round(us1[k], 1)],
        }
        for k in set(us0) | set(us1)
    ]
    total = {"kernel": "(all)", "calls": [sum(calls0.values()), sum(calls1.values())]}
    total["us"] = [round(sum(us0.values()), 1), round(sum(us1.values()), 1)]
    rows.sort(key=lambda r: -abs(r["us"][1] - r["us"][0]) - 1e3 * (r["calls"][0] != r["calls"][1]))
    return [total, *rows[:n]]


def level(llm: LLM, n: int, args, on, off, collections: Collections) -> dict:
    batch = prompts(llm, n)
    for params in (off, on, off, on):  # compiles, captures, the prompt cache's first keeps
        run(llm, batch, params)
    walls: dict[str, list[float]] = {"off": [], "on": []}
    cpus: dict[str, list[float]] = {"off": [], "on": []}
    before = drafting_counts(llm)
    drafted = 0
    gcs: dict[str, dict] = {"off": {}, "on": {}}  # generation -> [collections, ms], summed
    for i in range(args.pairs):
        pair = (("off", off), ("on", on))
        for name, params in pair if i % 2 == 0 else pair[::-1]:
            collections.take()
            dt, cpu, outs = timed_pass(llm, batch, params)
            for g, (c, ms) in collections.take().items():
                got = gcs[name].setdefault(g, [0, 0.0])
                got[0], got[1] = got[0] + c, round(got[1] + ms, 3)
            walls[name].append(dt * 1e3)
            cpus[name].append(cpu * 1e3)
            drafted += sum(o.stats.drafted for o in outs) if name == "on" else 0
    ratios = sorted(b / a for a, b in zip(walls["on"], walls["off"]))
    profiles = {
        name: self_times(host_profile(lambda p=params: run(llm, batch, p)))
        for name, params in (("off", off), ("on", on))
    }
    gpu = gpu_differences(llm, batch, on, off, args.top) if args.device == "cuda" else []
    return {
        "streams": n,
        "gpu_differences": gpu,
        "wall_ms": {k: round(median(v), 3) for k, v in walls.items()},
        "cpu_ms": {k: round(median(v), 3) for k, v in cpus.items()},
        "on_over_off": round(median(ratios), 4),
        "on_over_off_runs": [round(r, 4) for r in ratios],
        "drafted": drafted,
        "collections": gcs,
        "lone_drafting": {k: v - before.get(k, 0) for k, v in drafting_counts(llm).items()},
        "host_differences": differences(profiles["off"], profiles["on"], args.top),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--streams", default="16,64")
    ap.add_argument("--pairs", type=int, default=9)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    levels = [int(c) for c in args.streams.split(",")]
    llm = LLM(None, parallel=max(levels), device=args.device)
    on = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    off = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True, draft=False)
    collections = Collections()
    rows = [level(llm, n, args, on, off, collections) for n in levels]
    for r in rows:
        print(
            f"-- {r['streams']} streams: on / off {r['on_over_off']} "
            f"({r['on_over_off_runs'][0]}-{r['on_over_off_runs'][-1]}); wall ms off "
            f"{r['wall_ms']['off']} on {r['wall_ms']['on']}; host CPU ms off "
            f"{r['cpu_ms']['off']} on {r['cpu_ms']['on']}; drafted {r['drafted']}; "
            f"garbage collections by generation [count, ms] of all passes: {r['collections']}"
        )
        print(f"   {'GPU us off':>10} {'on':>8} {'calls off':>9} {'on':>6}  kernel")
        for d in r["gpu_differences"]:
            print(
                f"   {d['us'][0]:>10.1f} {d['us'][1]:>8.1f} {d['calls'][0]:>9} "
                f"{d['calls'][1]:>6}  {d['kernel']}"
            )
        print(f"   {'own ms off':>10} {'on':>8} {'calls off':>9} {'on':>6}  function")
        for d in r["host_differences"]:
            print(
                f"   {d['ms'][0]:>10.3f} {d['ms'][1]:>8.3f} {d['calls'][0]:>9} "
                f"{d['calls'][1]:>6}  {d['fn']}"
            )
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(json.dumps({"bench": "draft_overhead", "device": device, "levels": rows}))


if __name__ == "__main__":
    main()
