"""Where a batch's time goes, round by round: each host round's shared step (prompt rows,
decode windows), its lone call (sessions, steps launched, depth) and the shared rounds'
MTP drafts and head catch-ups, in wall ms with the device synchronized around each, for
bench_lanes_cpu.py's batch at one level, drafts off then on (a GPU diagnostic of issue 28's
drafting at 16 and 64 streams).

    python benchmarks/round_trace.py --device cuda --streams 16
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import torch
from bench_lanes_cpu import prompts

from flashlane.lanes import host as host_mod
from flashlane.lanes.core import LaneCore
from flashlane.llm import LLM
from flashlane.request import SamplingParams


class Trace:
    def __init__(self, device: str) -> None:
        self.events: list[dict] = []
        self.sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def wrap(self, fn, describe):
        def timed(*args, **kwargs):
            self.sync()
            t0 = time.perf_counter()
            got = fn(*args, **kwargs)
            self.sync()
            event = describe(args, kwargs, got)
            event["ms"] = round(1e3 * (time.perf_counter() - t0), 3)
            self.events.append(event)
            return got

        return timed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    llm = LLM(None, parallel=max(args.streams, 1), device=args.device)
    host = llm.engine.host
    trace = Trace(args.device)

    def step_event(a, kw, got):
        live, pieces = a[1], a[2]
        rows = sum(w.num_rows for w in pieces)
        return {"kind": "shared", "streams": len(live), "pieces": len(pieces), "rows": rows}

    def lone_event(a, kw, got):
        streams = a[1]
        steps = a[2] if len(a) > 2 else kw.get("steps")
        return {"kind": "lone", "b": len(streams), "budget": steps}

    LaneCore.step = trace.wrap(LaneCore.step, step_event)
    host_mod.run_lone = trace.wrap(host_mod.run_lone, lone_event)
    backend = host.backend
    backend.draft = trace.wrap(backend.draft, lambda a, kw, g: {"kind": "draft", "n": len(a[0])})
    drafter = backend.drafter
    drafter.catch_up = trace.wrap(drafter.catch_up, lambda a, kw, g: {"kind": "catch_up"})
    drv = host.lone
    if drv is not None and drv.drafting is not None:
        d = drv.drafting

        def drafted_event(a, kw, got):  # with the rule's prices (ms a token) and choice
            why = dict(d.verdict)
            return {"kind": "drafted", "b": len(a[0]), "ran": got and got[:2], "why": why}

        d.run = trace.wrap(d.run, drafted_event)

    batch = prompts(llm, args.streams)
    on = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    off = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True, draft=False)
    summary = {}
    for name, params in [("warm off", off), ("warm on", on), ("off", off), ("on", on)]:
        trace.events.clear()
        t0 = time.perf_counter()
        llm.generate(batch, params)
        wall = 1e3 * (time.perf_counter() - t0)
        totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        for e in trace.events:
            totals[e["kind"]][0] += 1
            totals[e["kind"]][1] += e["ms"]
        print(f"-- {name}: {wall:.1f} ms wall")
        for kind, (n, ms) in sorted(totals.items()):
            print(f"   {kind:>9}: {n:4d} calls {ms:9.2f} ms")
        if not name.startswith("warm"):
            for e in trace.events:
                print("     ", json.dumps(e))
            summary[name] = {"wall_ms": wall, "totals": dict(totals)}
    print(json.dumps({"bench": "round_trace", "streams": args.streams, "passes": summary}))


if __name__ == "__main__":
    main()
