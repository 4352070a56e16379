"""Where a short prompt's round and a drafted lone call's load spend their time (issue 28):
on the H200 the embedded model's 64-token reply spent 16.1 ms in its ~20-token prompt (one
shared round) against 24.4 ms decoding, and a drafted lone call 2.9-4.6 ms before its first
step (the MTP head absorbing the plain steps' queued cells) against 0.15 ms for a plain call
(bench_lanes_cuda_8fdb6b7_*). This splits both: wall time, kernel launches (a graph replay
counts one), the kernels' busy time, and the flashlane functions that hold the host longest.
Then a burst: --pieces prompts of the same length in one call (one round of that many prompt
pieces: their GDN layers run one varlen chunked call each, 1458129) against one prompt.

    python benchmarks/round_split.py --device cuda
    python benchmarks/round_split.py --device cpu --tokens 8     # a smoke test

Prints a short report, then one JSON line.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import time

import torch
from bench_lanes_cpu import widen_graphs

from flashlane.llm import LLM
from flashlane.request import SamplingParams

LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch", "cudaLaunchKernelExC")


def sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def profiled(fn, cuda: bool) -> dict:
    """fn() once under torch.profiler: launches, kernels' busy ms (CUDA), wall ms."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync(cuda)
    t = time.perf_counter()
    with profile(activities=acts) as prof:
        fn()
        sync(cuda)
    wall = time.perf_counter() - t
    events = prof.key_averages()
    launches = sum(e.count for e in events if e.key.startswith(LAUNCHES))
    busy = sum(
        getattr(e, "self_device_time_total", 0) for e in events if e.device_type.name == "CUDA"
    )
    return {"wall_ms": 1e3 * wall, "launches": launches, "kernels_ms": busy / 1e3}


def host_profile(fn) -> dict:
    """fn()'s host profile: cProfile's (file, line, name) -> (cc, nc, tt, ct, callers)."""
    pr = cProfile.Profile()
    pr.enable()
    fn()
    pr.disable()
    return pstats.Stats(pr).stats


def host_top(stats: dict, n: int = 12) -> list[tuple[str, float]]:
    """The flashlane functions with the most cumulative host time in a profile, ms."""
    rows = [
        (f"{path.rsplit('/flashlane/', 1)[-1]}:{name}", ct * 1e3)
        for (path, _, name), (_, _, _, ct, _) in stats.items()
        if "/flashlane/" in path and not path.rsplit("/flashlane/", 1)[-1].startswith("bench/")
    ]
    return sorted(rows, key=lambda r: -r[1])[:n]


def host_self(stats: dict, n: int = 15) -> list[tuple[str, int, float]]:
    """The functions (any package, builtins too) with the most host time of their own in a
    profile: name, calls, ms. On a GPU the round's host work is most of its wall."""
    rows = [
        (f"{path.rsplit('/', 1)[-1]}:{name}", nc, tt * 1e3)
        for (path, _, name), (_, nc, tt, _, _) in stats.items()
    ]
    return sorted(rows, key=lambda r: -r[2])[:n]


def phases(llm: LLM, args, one: SamplingParams, cuda: bool) -> dict:
    """A fresh short prompt's generate call split by phase, host ms (no sync inside: on a
    GPU the host enqueues and these are its costs), medians of --repeats fresh prompts (the
    prompt cache never serves them): the host's round, the backend's verify and inside it
    the model's residual and logits, keep and draft; "wait" is the last sync's."""
    engine, vocab = llm.engine, llm.engine.model_config.vocab_size
    targets = {
        "run_once": (engine.host, "run_once"),
        "verify": (engine.backend, "verify"),
        "residual": (engine.model, "residual"),
        "logits": (engine.model, "logits"),
        "keep": (engine.backend, "keep"),
        "draft": (engine.backend, "draft"),
    }
    spent: dict[str, float] = {}

    def timed(name, fn):
        def inner(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[name] = spent.get(name, 0.0) + 1e3 * (time.perf_counter() - t)

        return inner

    saved = {n: getattr(o, a) for n, (o, a) in targets.items()}
    for n, (o, a) in targets.items():
        setattr(o, a, timed(n, saved[n]))
    runs: list[dict[str, float]] = []
    try:
        for k in range(args.repeats + 2):
            prompt = [[(13 + 37 * i + 7919 * k) % vocab for i in range(args.prompt_len)]]
            spent.clear()
            sync(cuda)
            t = time.perf_counter()
            llm.generate(prompt, one)
            host = 1e3 * (time.perf_counter() - t)
            sync(cuda)
            runs.append({"wall": 1e3 * (time.perf_counter() - t), "host": host, **spent})
    finally:
        for n, (o, a) in targets.items():
            setattr(o, a, saved[n])
    runs = runs[2:]  # the first two warm up
    return {k: round(statistics.median(r.get(k, 0.0) for r in runs), 3) for k in runs[0]}


def burst(llm: LLM, args, one: SamplingParams, cuda: bool) -> dict:
    """--pieces prompts of --prompt-len tokens in one generate call, one token out each:
    wall (median of --repeats, other prompts each time: no prompt cache), then profiled."""
    vocab, made = llm.engine.model_config.vocab_size, [0]

    def prompts() -> list[list[int]]:
        made[0] += 1
        return [
            [(97 + 31 * i + 7 * j + 1009 * made[0]) % vocab for i in range(args.prompt_len)]
            for j in range(args.pieces)
        ]

    for _ in range(2):
        llm.generate(prompts(), one)
    walls = []
    for _ in range(args.repeats):
        batch = prompts()
        sync(cuda)
        t = time.perf_counter()
        llm.generate(batch, one)
        sync(cuda)
        walls.append(1e3 * (time.perf_counter() - t))
    batch = prompts()
    # where the host holds a burst's round (its kernels are a few percent of its wall)
    stats = host_profile(lambda: llm.generate(prompts(), one))
    return {
        "prompts": args.pieces,
        "wall_ms_median": statistics.median(walls),
        **profiled(lambda: llm.generate(batch, one), cuda),
        "host": host_top(stats, 25),
        "self": host_self(stats, 25),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a checkpoint folder (default: embedded)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompt-len", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=64, help="the drafted reply's tokens")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--pieces", type=int, default=8, help="prompts of the burst (0: none)")
    ap.add_argument("--graph-rows", type=int, default=None, help="an experiment: widen_graphs")
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    llm = LLM(args.model, parallel=max(4, args.pieces), device=args.device)
    widen_graphs(llm, args.graph_rows)
    vocab = llm.engine.model_config.vocab_size
    prompt = [[(97 + 31 * i) % vocab for i in range(args.prompt_len)]]
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, draft=False)
    out: dict = {"bench": "round_split", "device": args.device, "prompt_len": args.prompt_len}

    def ttft() -> None:
        llm.generate(prompt, one)

    for _ in range(3):  # compiles and captures first
        ttft()
    walls = []
    for _ in range(args.repeats):
        sync(cuda)
        t = time.perf_counter()
        ttft()
        sync(cuda)
        walls.append(1e3 * (time.perf_counter() - t))
    out["prompt_round"] = {"wall_ms_median": statistics.median(walls), **profiled(ttft, cuda)}
    out["prompt_phases"] = phases(llm, args, one, cuda)
    fresh = llm.engine.backend.fresh  # runner/fresh.py: lone short prompts in one graph
    out["fresh"] = None if fresh is None else {
        "lengths": sorted(fresh.entries), "capture_s": round(fresh.capture_seconds, 3),
        "runs": fresh.num_runs, "failed": fresh.failed,
    }  # fmt: skip
    stats = host_profile(ttft)
    out["prompt_round_host"] = host_top(stats)
    out["prompt_round_self"] = host_self(stats)
    if args.pieces > 0:
        out["burst"] = burst(llm, args, one, cuda)

    # a drafted reply: the drafted lone calls' loads, and the absorbs inside them
    lone = getattr(llm.engine.host, "lone", None)
    drafter = llm.engine.backend.drafter
    drafted = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    absorbs: list[tuple[int, float]] = []
    if drafter is not None:
        inner = drafter.absorb_waiting

        def timed_absorb(stream_ids, sessions, pending, **kw):
            cells = sum(
                len(drafter.waiting[s].next_ids) for s in stream_ids if s in drafter.waiting
            )
            sync(cuda)
            t = time.perf_counter()
            inner(stream_ids, sessions, pending, **kw)
            sync(cuda)
            absorbs.append((cells, 1e3 * (time.perf_counter() - t)))

        drafter.absorb_waiting = timed_absorb
    for _ in range(args.repeats):
        failed = [o for o in llm.generate(prompt, drafted) if o.finish_reason == "error"]
        if failed:  # a benchmark of replies that failed times nothing
            raise SystemExit(f"round_split: a drafted reply failed: {failed[0].error}")
    out["drafted"] = {
        "absorbs": len(absorbs),
        "absorb_ms_median": statistics.median(ms for _, ms in absorbs) if absorbs else None,
        "cells_median": statistics.median(c for c, _ in absorbs) if absorbs else None,
        "lone_load_ms": {
            f"{b},{d}": round(v, 4) for (b, d), v in (lone.load_ms if lone else {}).items()
        },
        "lone_step_ms": {
            f"{b},{d}": round(v, 4) for (b, d), v in (lone.step_ms if lone else {}).items()
        },
        "lone_drafted_calls": getattr(getattr(lone, "drafting", None), "num_drafted", None),
        # where the replies' rounds went, and whether the driver gave up its graphs
        "host_counts": dict(llm.engine.host.counts),
        "lone_steps": getattr(lone, "num_steps", None),
        "lone_failed": getattr(lone, "failed", None),
        "absorber": None
        if lone is None or lone.drafting is None
        else [lone.drafting.absorber.num_graphed, lone.drafting.absorber.num_eager],
    }
    if absorbs:
        # one absorb under the profiler: its launches
        def again():
            llm.generate(prompt, drafted)

        profiled_absorb: list[dict] = []
        drafter.absorb_waiting = lambda *a, **kw: profiled_absorb.append(
            profiled(lambda: inner(*a, **kw), cuda)
        )
        again()
        out["drafted"]["absorb_profiled"] = profiled_absorb[:3]
        # and one absorb's host time by flashlane function
        held: list[list] = []
        drafter.absorb_waiting = lambda *a, **kw: held.append(
            host_top(host_profile(lambda: inner(*a, **kw)))
        )
        again()
        out["drafted"]["absorb_host"] = held[0] if held else []
    p = out["prompt_round"]
    print(
        f"prompt of {args.prompt_len} tokens, one token out: {p['wall_ms_median']:.2f} ms "
        f"(median of {args.repeats}); profiled {p['wall_ms']:.2f} ms wall, {p['launches']} "
        f"launches, {p['kernels_ms']:.2f} ms of kernels"
    )
    print("  fresh prompts by phase, host ms (medians):", out["prompt_phases"])
    print("  fresh prompt graphs:", out["fresh"])
    for name, ms in out["prompt_round_host"]:
        print(f"  {ms:8.2f} ms  {name}")
    print("  host time of their own (cProfile):")
    for name, calls, ms in out["prompt_round_self"]:
        print(f"  {ms:8.2f} ms  {calls:6d}  {name}")
    if "burst" in out:
        b = out["burst"]
        print(
            f"{b['prompts']} prompts of {args.prompt_len} tokens in one call: "
            f"{b['wall_ms_median']:.2f} ms (median of {args.repeats}); profiled "
            f"{b['wall_ms']:.2f} ms wall, {b['launches']} launches, {b['kernels_ms']:.2f} ms of kernels"
        )
        for name, ms in b["host"]:
            print(f"  {ms:8.2f} ms  {name}")
        print("  host time of their own (cProfile):")
        for name, calls, ms in b["self"]:
            print(f"  {ms:8.2f} ms  {calls:6d}  {name}")
    d = out["drafted"]
    print(
        f"drafted replies of {args.tokens}: {d['absorbs']} absorbs, median "
        f"{d['absorb_ms_median']} ms for {d['cells_median']} cells; lone load_ms "
        f"{d['lone_load_ms']}, step_ms {d['lone_step_ms']}; lone steps {d['lone_steps']}, "
        f"failed {d['lone_failed']}, absorber pieces (graphed, eager) {d['absorber']}, host "
        f"counts {d['host_counts']}"
    )
    for a in d.get("absorb_profiled", []):
        print(f"  an absorb: {a['wall_ms']:.2f} ms wall, {a['launches']} launches, "
              f"{a['kernels_ms']:.2f} ms of kernels")  # fmt: skip
    for name, ms in d.get("absorb_host", []):
        print(f"  {ms:8.2f} ms  {name}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
