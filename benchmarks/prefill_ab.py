"""Why `bench model`'s prefill differs from profile_gpu.py's on the same engine: one built
model, the same prompt lengths timed at each stage of bench model's sequence, with the
Python collector held off (as bench model's prefill_seconds does) and on.

On the H200 at f7dfcdb, flashnext-12l, 16 sessions of 20,672: `bench model` timed an 8,192-token
prompt at 246 ms (33k tok/s) where profile_gpu.py, on an engine built the same way, timed
112 ms with 107 ms of kernels (benchmarks/LOG.md, 2026-12-04). This prints one row a stage:

    python benchmarks/prefill_ab.py --config flashnext-12l --prefill 2048,8192
    python benchmarks/prefill_ab.py --device cpu --config flashnext-tiny --prefill 512  # smoke
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch

from flashlane.bench.common import FLAT_COSTS, random_prompts
from flashlane.bench.model_figures import FILL_ROOM, decode_together, launches_per_token
from flashlane.config import EngineConfig
from flashlane.engine import Engine
from flashlane.llm import LLM
from flashlane.models.presets import preset
from flashlane.models.random_weights import build_random
from flashlane.request import SamplingParams
from flashlane.roofline import measure_ceilings


def timed(llm: LLM, vocab: int, length: int, seed: int, hold_gc: bool, cuda: bool) -> tuple:
    """(the engine's prefill seconds, the wall seconds to the reply) of one fresh prompt."""
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, draft=False)
    prompts = random_prompts(1, length, vocab, seed)
    gc.collect()
    if hold_gc:
        gc.disable()
    try:
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = llm.generate(prompts, one)
        if cuda:
            torch.cuda.synchronize()
        return out[0].stats.prefill_seconds, time.perf_counter() - t
    finally:
        gc.enable()


def row(llm, cfg, args, stage: str, cuda: bool, same: bool = False) -> None:
    """One line a prompt length: fresh prompts (bench model's), or one prompt again and
    again (`same`: profile_gpu.py's)."""
    for length in args.prefill:
        cells = []
        for hold in (True, False):
            runs = [
                timed(llm, cfg.vocab_size, length, 1000 * length + (0 if same else i), hold, cuda)
                for i in range(args.repeats)
            ]
            stat = statistics.median(r[0] for r in runs) * 1e3
            wall = statistics.median(r[1] for r in runs) * 1e3
            cells.append(f"{stat:9.1f} {wall:9.1f}")
        print(f"{stage:<31} {length:>7}  " + "   ".join(cells), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="flashnext-12l")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prefill", default="2048,8192", help="prompt lengths, comma-separated")
    ap.add_argument("--streams", type=int, default=16, help="sessions, as bench model's")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    args.prefill = [int(x) for x in args.prefill.split(",")]
    cuda = args.device.startswith("cuda")
    if cuda:  # bench model measures the ceilings before it builds
        measure_ceilings(args.device)
        torch.cuda.empty_cache()
    dtype = torch.bfloat16 if cuda else torch.float64
    cfg, model = build_random(preset(args.config), dtype, args.device, 0, None, "device")
    # bench model's rule (64-token prompts, 128 decoded, 64 spare, FILL_ROOM), in the window
    context = min(max(args.prefill) + 64 + 128 + 64 + FILL_ROOM, cfg.max_position_embeddings)
    config = EngineConfig.resolve(
        device=args.device, parallel=args.streams, context=context, drafts=False, prompt_cache_gb=0
    )
    llm = LLM.from_engine(Engine(config, costs=FLAT_COSTS, built=(cfg, model)))
    warm = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, draft=False)
    for length in args.prefill:
        llm.generate(random_prompts(1, length, cfg.vocab_size, 98), warm)
    print(f"{args.config} on {args.device}, {args.streams} sessions of {context}; ms, medians")
    print(
        f"{'stage':<31} {'tokens':>7}  {'gc held: engine':>15} {'wall':>9}   {'gc on':>9} {'wall':>9}"
    )
    row(llm, cfg, args, "warm", cuda)
    row(llm, cfg, args, "one prompt, again", cuda, same=True)
    greedy = SamplingParams(max_tokens=129, temperature=0.0, ignore_eos=True, draft=False)
    llm.generate(random_prompts(args.streams, 64, cfg.vocab_size, 7), greedy)
    row(llm, cfg, args, f"after {args.streams} streams decode", cuda)
    llm.generate(random_prompts(1, 64, cfg.vocab_size, 8), greedy)
    row(llm, cfg, args, "after one stream (lone)", cuda)
    # bench model's decode rows: streams submitted with a whole session's room, cancelled
    decode_together(llm, random_prompts(args.streams, 64, cfg.vocab_size, 9), greedy, 128)
    row(llm, cfg, args, "after decode_together", cuda)
    host = llm.engine.host
    lone, host.lone = host.lone, None  # bench model's one stream through shared rounds
    try:
        decode_together(llm, random_prompts(1, 64, cfg.vocab_size, 10), greedy, 128)
    finally:
        host.lone = lone
    row(llm, cfg, args, "after shared rounds (lone off)", cuda)
    if cuda:
        launches_per_token(llm, cfg)
        row(llm, cfg, args, "after the launch profiler", cuda)
        # profile_gpu.py timed its prefill with the profiler (CUPTI) tracing kernels
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
            row(llm, cfg, args, "inside torch.profiler", cuda)
        row(llm, cfg, args, "after torch.profiler", cuda)


if __name__ == "__main__":
    main()
