"""The keyed draw's share of a decode round (issue 4: at most 5%), measured inside the rounds.

A random checkpoint decodes N streams of sampled requests through shared rounds; the round's
draw (`backend._draw_all`: greedy picks, then every other row in one batch, the fused GPU draw
on CUDA) and each host round (`LaneHost.run_once`) are timed with a device sync before and
after, and the share is the draw's time over the rounds' time (the prompt round included: its
draw is one row a stream too).

    python benchmarks/bench_draw_share.py --device cuda [--config flashnext-12l] [--streams 16]

Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime, timezone

import torch

from flashlane.bench.common import FLAT_COSTS, random_prompts
from flashlane.config import EngineConfig
from flashlane.engine import Engine
from flashlane.lanes import host as host_module
from flashlane.llm import LLM
from flashlane.models.presets import preset
from flashlane.models.random_weights import build_random
from flashlane.request import SamplingParams
from flashlane.runner import backend as backend_module

KINDS = {
    "top_p 0.95": dict(temperature=1.0, top_p=0.95),
    "top_k 20": dict(temperature=0.8, top_k=20),
    "min_p 0.05": dict(temperature=1.0, min_p=0.05),
    "plain T=1": dict(temperature=1.0),
}


def timed(owner, name: str, totals: dict, key: str, device: str):
    fn = getattr(owner, name)

    def wrapper(*args, **kwargs):
        sync(device)
        t = time.perf_counter()
        out = fn(*args, **kwargs)
        sync(device)
        totals[key] += time.perf_counter() - t
        return out

    setattr(owner, name, wrapper)
    return fn


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--config", default="flashnext-12l")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    cfg, model = build_random(
        preset(args.config), torch.bfloat16 if cuda else torch.float64, args.device, 0
    )
    config = EngineConfig.resolve(
        device=args.device, parallel=args.streams, context=512, drafts=False, prompt_cache_gb=0
    )
    llm = LLM.from_engine(Engine(config, costs=FLAT_COSTS, built=(cfg, model)))
    prompts = random_prompts(args.streams, 64, cfg.vocab_size, 3)
    rows = {}
    for kind, extra in KINDS.items():
        params = [
            SamplingParams(max_tokens=args.tokens, ignore_eos=True, draft=False, seed=i, **extra)
            for i in range(args.streams)
        ]
        llm.generate(prompts, params)  # compile and warm
        totals = {"draw": 0.0, "round": 0.0}
        draw = timed(backend_module, "_draw_all", totals, "draw", args.device)
        run_once = timed(host_module.LaneHost, "run_once", totals, "round", args.device)
        try:
            outs = llm.generate(prompts, params)
        finally:
            backend_module._draw_all, host_module.LaneHost.run_once = draw, run_once
        assert all(len(o.token_ids) == args.tokens for o in outs)
        rows[kind] = {
            "draw_s": totals["draw"],
            "rounds_s": totals["round"],
            "share": totals["draw"] / totals["round"],
        }
    print(
        f"{'kind':12} {'draw ms':>9} {'rounds ms':>10} {'share':>7}   ({args.streams} streams, "
        f"{args.config}, {args.tokens} tokens)"
    )
    for kind, r in rows.items():
        print(f"{kind:12} {1e3 * r['draw_s']:9.1f} {1e3 * r['rounds_s']:10.1f} {r['share']:7.1%}")
    print(
        json.dumps(
            {
                "bench": "draw_share",
                "device": torch.cuda.get_device_name() if cuda else "cpu",
                "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "command": "python benchmarks/bench_draw_share.py "
                + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
                "figures": rows,
            }
        )
    )


if __name__ == "__main__":
    main()
