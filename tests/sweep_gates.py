"""The engine's exactness gates over one checkpoint, on any device: the shape sweeps' check.

Every reply must be the same token for token whichever way it was served: alone (the lone
driver) or batched with 2 or 15 other streams in shared rounds, drafted or not, fresh or
resumed from the prompt cache, in a small session that it outgrows (moved or paused) or a
large one; greedy and seeded. The batched runs come first, so they are fresh; the alone
runs resume the prompts the cache kept.
"""

from __future__ import annotations

import dataclasses
import gc

import torch

from flashlane.lanes.records import CostTable
from flashlane.llm import LLM
from flashlane.request import SamplingParams

# prices fixed so that no run times anything (DESIGN.md section 9)
COSTS = CostTable({1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.4}, draft_step_ms=0.3, overhead_ms=0.2)
LENGTHS = [5, 70, 17, 130, 9, 64, 33, 3, 200, 41, 66, 12, 90, 1, 127, 150]
PARAMS = {
    "greedy": SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True),
    "seeded": SamplingParams(max_tokens=16, temperature=0.9, top_p=0.95, seed=11, ignore_eos=True),
}


def prompts(vocab: int, num: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(3, vocab, (LENGTHS[i],), generator=g).tolist() for i in range(num)]


def check_replies(folder, device: str, vocab: int, num: int = 16, **options) -> dict:
    """Serve `num` prompts every way; return the counts of replies compared and differing,
    with moves, pauses and resumed tokens seen (so a sweep shows the paths ran). options:
    more engine options (kv_cache_dtype="fp8")."""
    # one small session: the 70- and 64-token prompts fit it at admission, then outgrow it
    llm = LLM(
        str(folder),
        device=device,
        costs=COSTS,
        parallel=num,
        max_rows=64,
        slot_contexts=f"80,512x{num - 1}",
        slot_grow=8,
        **options,
    )
    ps = prompts(vocab, num)
    seen = dict(compared=0, differ=0, moves=0, pauses=0, cached_tokens=0, errors=0)
    differing: list[str] = []
    try:
        for kind, params in PARAMS.items():
            drafted = [dataclasses.replace(params, draft=i % 3 != 1) for i in range(num)]
            runs = {
                f"{num}": llm.generate(ps, drafted),
                "3": llm.generate(ps[:3], drafted[:3]),
                f"{num} undrafted": llm.generate(ps, dataclasses.replace(params, draft=False)),
            }
            alone = [llm.generate(p, dataclasses.replace(params, draft=False))[0] for p in ps]
            for name, outs in runs.items():
                for i, (got, want) in enumerate(zip(outs, alone)):
                    seen["compared"] += 1
                    seen["errors"] += got.error is not None
                    if got.token_ids != want.token_ids:
                        seen["differ"] += 1
                        differing.append(f"{kind} batch {name} stream {i}")
            for out in [o for outs in runs.values() for o in outs] + alone:
                seen["moves"] += out.stats.moves
                seen["pauses"] += out.stats.pauses
                seen["cached_tokens"] += out.stats.cached_tokens
                seen["errors"] += out.error is not None
    finally:
        del llm
        gc.collect()
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return dict(seen, differing=differing[:8])
