"""Drafted lone steps against plain ones on the GPU (issue 9): the embedded model on code
prompts, greedy, drafts on (drafted lone steps of depth 1, 2 or 3, always) and off, one
stream and four together. Prints each side's decode tok/s (replies of --tokens tokens, the
prompt's prefill included), the driver's measured ms a step by (streams, depth), the drafts'
landing rate and whether every reply equalled its undrafted one; ends with one JSON line.

    python benchmarks/lone_drafts.py [--tokens 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from statistics import median

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_lanes_cpu import PROMPTS
from flashlane.llm import LLM
from flashlane.request import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--depths", default="1,2,3")
    args = ap.parse_args()
    llm = LLM(device="cuda", parallel=4, lone_streams=4)
    lone = llm.engine.host.lone
    drafting = lone.drafting
    on = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    off = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True, draft=False)
    rows, exact = [], True
    for streams in (1, 4):
        batch = PROMPTS[:streams]
        want = [o.token_ids for o in llm.generate(batch, off)]  # untimed: compiles, captures
        for depth in [0, *map(int, args.depths.split(","))]:
            if depth:
                drafting.depth = depth
                drafting.choose = lambda ids, *rest, d=depth: d  # always drafted
            params = on if depth else off
            llm.generate(batch, params)  # untimed: this depth's graphs
            landed0, drafted0 = drafting.num_landed, drafting.num_drafted
            captured0 = lone.capture_seconds
            rates = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                outs = llm.generate(batch, params)
                rates.append(sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0))
                exact &= [o.token_ids for o in outs] == want
            drafted = drafting.num_drafted - drafted0
            rows.append(
                dict(
                    streams=streams,
                    depth=depth,
                    tok_s=median(rates),
                    landed=(drafting.num_landed - landed0) / drafted if drafted else None,
                    step_ms=lone.step_ms.get((streams, depth)),
                    capture_s=lone.capture_seconds - captured0,
                )
            )
    base = {r["streams"]: r["tok_s"] for r in rows if r["depth"] == 0}
    print(
        f"{'streams':>7} {'depth':>5} {'tok/s':>8} {'x off':>6} {'landed':>6} {'ms a step':>9} "
        f"{'captures':>8}"
    )
    for r in rows:
        r["over_off"] = r["tok_s"] / base[r["streams"]]
        landed = f"{r['landed']:.2f}" if r["landed"] is not None else "-"
        ms = f"{r['step_ms']:.3f}" if r["step_ms"] else "-"
        print(
            f"{r['streams']:>7} {r['depth']:>5} {r['tok_s']:>8.1f} {r['over_off']:>6.2f} "
            f"{landed:>6} {ms:>9} {r['capture_s']:>7.2f}s"
        )
    print(
        json.dumps(
            dict(
                bench="lone_drafts",
                tokens=args.tokens,
                exact=exact,
                rows=rows,
                graphs=len(lone.graphs),
            )
        )
    )


if __name__ == "__main__":
    main()
