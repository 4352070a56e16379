"""Whether the lone driver's loop waits on the GPU or on its host (issue 28): a lone call
keeps two steps in flight, and between them the host reads the landed step's rows (waiting on
its event) and hands each stream's token to its take (`land`: the stop rules, the copy index,
the heads' queues). Where the wait is near zero the steps wait on the host, and every
microsecond of host work a token shows in the step time (at 16ac721 drafts on ran 0.4-1.8%
slower at 16 and 64 streams, where nothing drafts, for ~0.25 ms of extra host calls a pass).

For each level, greedy replies of --tokens on bench_lanes_cpu.py's code prompts, drafts off
then on (untimed first passes, then one timed pass each): the lone calls' steps, their wall
time a step, and of that the host's wait for the step's rows and its land.

    PYTHONPATH=. python benchmarks/lone_host.py --device cuda --streams 16,64
    PYTHONPATH=. python benchmarks/lone_host.py --device cpu --streams 4 --tokens 8

Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

from bench_lanes_cpu import prompts
from draft_choices import lone_llm

from flashlane.request import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--streams", default="16,64", help="levels in order (default 16,64)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens a reply (default 64)")
    args = ap.parse_args()
    levels = [int(n) for n in args.streams.split(",")]
    llm, drv = lone_llm(args.device, max(levels))
    spent = {"steps": 0, "wall": 0.0, "wait": 0.0, "land": 0.0}
    run_steps, read = drv.run_steps, drv._read

    def timed_read(io, i):
        t = time.perf_counter()
        try:
            return read(io, i)
        finally:
            spent["wait"] += time.perf_counter() - t

    def timed_steps(ids, io, budget, land, *rest, **kw):
        def timed_land(rows):
            t = time.perf_counter()
            try:
                return land(rows)
            finally:
                spent["land"] += time.perf_counter() - t

        t = time.perf_counter()
        n = run_steps(ids, io, budget, timed_land, *rest, **kw)
        spent["wall"] += time.perf_counter() - t
        spent["steps"] += n
        return n

    drv.run_steps, drv._read = timed_steps, timed_read
    on = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    off = dataclasses.replace(on, draft=False)
    rows = []
    print("streams  drafts  steps  us a step  wait  land  other")
    for n in levels:
        batch = prompts(llm, n)
        for params in (off, on, off, on):  # compiles and captures first
            llm.generate(batch, params)
        for name, params in (("off", off), ("on", on)):
            spent.update(steps=0, wall=0.0, wait=0.0, land=0.0)
            llm.generate(batch, params)
            k = max(1, spent["steps"])
            us = {key: 1e6 * spent[key] / k for key in ("wall", "wait", "land")}
            other = us["wall"] - us["wait"] - us["land"]
            rows.append({"streams": n, "drafts": name, "steps": spent["steps"], **us})
            print(
                f"{n:7d}  {name:>6}  {spent['steps']:5d}  {us['wall']:9.1f}  {us['wait']:4.0f}"
                f"  {us['land']:4.0f}  {other:5.0f}"
            )
    print(json.dumps({"bench": "lone_host", "device": args.device, "rows": rows}))


if __name__ == "__main__":
    main()
