"""Replays `flashlane bench serve --check-alone`'s prompts through an engine in one process,
without the server, to find what a served reply that differs from its alone reply needs.

The model is the one `flashlane serve --config C --random-weights` builds (weights seed 0),
the prompts are bench serve's (its words, the embedded tokenizer, no seed), greedy with
ignore_eos (with --seed: temperature 1, seed + i, as bench serve --seed sends them), the
engine on its default flags. The replies are generated:

  alone:      one prompt at a time, in order (as --check-alone does, on a used engine);
  fresh:      the prompts that differ anywhere, each alone on a new engine;
  groups4:    four prompts at a time (0-3, 4-7, ...);
  shifted4:   four at a time from prompt 2 (2-5, 6-9, ...; 0-1 last);
  all:        every prompt at once.

and every variant's replies are compared with `alone`: which prompts differ and the first
token where. Prints one line per variant and a JSON line; exits 1 if any reply differs.

    python benchmarks/alone_replay.py --device cuda --config flashnext-12l
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from types import SimpleNamespace

import torch

from flashlane.bench.serve import EMBEDDED, load_tokenizer, make_prompts
from flashlane.config import EngineConfig
from flashlane.engine import Engine, compute_dtypes
from flashlane.llm import LLM
from flashlane.models.presets import config_dict
from flashlane.models.random_weights import build_random, random_table_place
from flashlane.request import SamplingParams


def new_llm(args) -> LLM:
    config = EngineConfig.resolve(device=args.device)
    device = config.resolved_device()
    weights, _, _ = compute_dtypes(device, "auto")
    raw = config_dict(args.config)
    tables = random_table_place(raw, device, None, None)
    built = build_random(raw, weights, device, 0, None, tables)
    return LLM.from_engine(Engine(config, built=built))


def replies(llm: LLM, prompts: list[list[int]], params: list, groups: list[list[int]]) -> dict:
    """Prompt i's token ids with params[i], the prompts sent group by group."""
    out = {}
    for g in groups:
        for i, r in zip(g, llm.generate([prompts[i] for i in g], [params[i] for i in g])):
            if r.error is not None:
                raise RuntimeError(f"prompt {i}: {r.error}")
            out[i] = r.token_ids
    return out


def first_difference(a: list[int], b: list[int]) -> int:
    return next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--config", default="flashnext-12l")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--seed", type=int, default=None, help="sampled replies (default: greedy)")
    args = p.parse_args()
    prompts = make_prompts(
        load_tokenizer(EMBEDDED),
        SimpleNamespace(seed=None, num_prompts=args.num_prompts, input_len=args.input_len),
    )
    # as bench serve sends them: greedy, or with --seed temperature 1 and seed + i
    params = [
        SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
        if args.seed is None
        else SamplingParams(
            max_tokens=args.output_len, temperature=1.0, seed=args.seed + i, ignore_eos=True
        )
        for i in range(args.num_prompts)
    ]
    n = len(prompts)
    llm = new_llm(args)
    vocab = llm.engine.model_config.vocab_size  # a tiny config's ids folded into its vocab
    prompts = [[t % vocab for t in q] for q in prompts]
    t0 = time.perf_counter()
    want = replies(llm, prompts, params, [[i] for i in range(n)])
    variants = {
        "groups4": [list(range(a, min(a + 4, n))) for a in range(0, n, 4)],
        "shifted4": [list(range(a, min(a + 4, n))) for a in range(2, n, 4)] + [[0, 1]],
        "all": [list(range(n))],
    }
    result = {"config": args.config, "device": args.device, "prompts": n, "seed": args.seed}
    result["variants"] = {}
    differing: set[int] = set()
    for name, groups in variants.items():
        got = replies(llm, prompts, params, groups)
        diff = {i: first_difference(got[i], want[i]) for i in range(n) if got[i] != want[i]}
        differing |= set(diff)
        result["variants"][name] = diff
        print(f"{name:>9}: {len(diff)} of {n} differ from alone {diff}", flush=True)
    if differing:
        del llm
        gc.collect()  # the engine's graphs and pools go with it before the next is built
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
        fresh = new_llm(args)
        diff = {}
        for i in sorted(differing):
            got = replies(fresh, prompts, params, [[i]])[i]
            if got != want[i]:
                diff[i] = first_difference(got, want[i])
        result["variants"]["fresh"] = diff
        print(f"    fresh: {len(diff)} of {len(differing)} differ from alone {diff}")
    result["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result))
    if any(result["variants"].values()):
        raise SystemExit(1)  # a reply that differs from alone fails the check


if __name__ == "__main__":
    main()
