"""Why a lone drafted call drafts or not: each of Drafting.choose's verdicts with the measures
it weighed (step and load ms, landing rates), over bench_lanes_cpu.py's sequence at one level
(a warm pass off and on, then off / on pairs). A GPU diagnostic of issue 28's drafting.

    python benchmarks/draft_choices.py --device cuda [--streams 1] [--pairs 3]
"""

from __future__ import annotations

import argparse
import json

from bench_lanes_cpu import prompts

from flashlane.llm import LLM
from flashlane.request import SamplingParams
from flashlane.runner.lone_draft import Drafting


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    llm = LLM(None, parallel=max(args.streams, 1), device=args.device)
    drv = llm.engine.host.lone
    if drv is None or drv.drafting is None:
        raise SystemExit("draft_choices: no drafting lone driver here")
    log: list[dict] = []
    inner = Drafting._better

    def spy(self, b, steps, left, carried=False):
        got = inner(self, b, steps, left, carried)
        log.append({
            "b": b, "steps": steps, "left": left, "carried": carried, "depth": got,
            "probing": self.probing, "best": self.best, "until_probe": self.until_probe,
            "rates": [round(self.stats.rate(d), 3) for d in range(1, self.depth + 1)],
            "step_ms": {f"{k}": round(v, 3) for k, v in drv.step_ms.items() if k[0] == b},
            "load_ms": {f"{k}": round(v, 3) for k, v in drv.load_ms.items() if k[0] == b},
        })  # fmt: skip
        return got

    Drafting._better = spy
    batch = prompts(llm, args.streams)
    on = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    off = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True, draft=False)
    for name, params in [("warm off", off), ("warm on", on)] + [
        ("off", off),
        ("on", on),
    ] * args.pairs:
        before = len(log)
        llm.generate(batch, params)
        print(f"-- {name}")
        for entry in log[before:]:
            print("  ", json.dumps(entry))
    print(json.dumps({"bench": "draft_choices", "choices": log}))


if __name__ == "__main__":
    main()
