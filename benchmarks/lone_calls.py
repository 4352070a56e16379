"""The lone driver's calls for a few greedy replies, one at a time: each call's sessions,
depth, budget, steps launched, Triton compiles inside it and wall ms; then the driver's step
and load tables and why it stopped graphing, if it did (a diagnosis of round_split's
drafted replies finding no lone timing on the H200 at 997cb52).

    python benchmarks/lone_calls.py --device cuda
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from flashlane.kernels import compiles
from flashlane.llm import LLM
from flashlane.request import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--replies", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    llm = LLM(None, parallel=8, device=args.device)
    host = llm.engine.host
    drv = host.lone
    print(f"lone driver: {drv is not None}, lone_streams {host.config.lone_streams}")
    if drv is None:
        return
    vocab = llm.engine.model_config.vocab_size
    prompt = [[(97 + 31 * i) % vocab for i in range(20)]]
    calls: list[dict] = []
    inner = drv.run_steps

    def spy(ids, io, budget, land, *rest):
        c0, t = compiles.count(), time.perf_counter()
        n = inner(ids, io, budget, land, *rest)
        calls.append({
            "sessions": len(ids), "depth": getattr(io, "depth", 0), "budget": budget,
            "launched": n, "compiles": compiles.count() - c0,
            "ms": round(1e3 * (time.perf_counter() - t), 3),
        })  # fmt: skip
        return n

    drv.run_steps = spy
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    for r in range(args.replies):
        before = len(calls)
        llm.generate(prompt, params)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        print(f"reply {r}: {len(calls) - before} lone calls")
        for c in calls[before:]:
            print("  ", c)
    print("step_ms", drv.step_ms, "load_ms", drv.load_ms)
    print("drafted calls", drv.drafting.num_drafted, "failed", getattr(drv, "failed", None))
    print("host counts", host.counts)
    print(json.dumps({"bench": "lone_calls", "calls": calls}))


if __name__ == "__main__":
    main()
