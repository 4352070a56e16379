"""A long prompt arriving while a stream decodes: the decoding stream's longest gap between
tokens (issue 29's stall). Embedded model, one stream decoding greedily; at round 5 a prompt
of --prompt-len tokens (random words of this repository's source, tokenized) arrives. Prints
the rounds over a second and one JSON line.

    python benchmarks/long_prompt_stall.py --prompt-len 22141 [--device cpu]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import time
from pathlib import Path

from flashlane.bench.common import commit
from flashlane.llm import LLM
from flashlane.request import SamplingParams


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompt-len", type=int, default=22141)
    p.add_argument("--decode-tokens", type=int, default=400)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    llm = LLM(parallel=2, context=32768, device=args.device)
    host, tok = llm.engine.host, llm.engine.tokenizer
    words = (Path(__file__).parents[1] / "flashlane" / "engine.py").read_text().split()
    rng = random.Random(0)
    ids = tok.encode(" ".join(rng.choice(words) for _ in range(2 * args.prompt_len))).ids
    ids = ids[: args.prompt_len]
    greedy = SamplingParams(max_tokens=args.decode_tokens, temperature=0.0, ignore_eos=True)
    host.submit("decoding", tok.encode("def main():").ids, greedy)
    stamps, rounds, slow = [], 0, []
    start = time.perf_counter()
    while host.has_work:
        rounds += 1
        if rounds == 5:
            host.submit("long", ids, SamplingParams(max_tokens=4, temperature=0.0))
        t = time.perf_counter()
        for u in host.run_once():
            if u.stream.request_id == "decoding" and u.token_ids:
                stamps.append(time.perf_counter())
        if time.perf_counter() - t > 1.0:
            slow.append(round(time.perf_counter() - t, 2))
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    out = {
        "bench": "long_prompt_stall",
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d"),
        "device": args.device,
        "prompt_len": len(ids),
        "updates": len(stamps),  # deliveries with tokens (a round may bring several)
        "longest_gap_s": max(gaps),
        "median_gap_s": statistics.median(gaps),
        "rounds_over_1s": slow,
        "wall_s": time.perf_counter() - start,
    }
    print(
        f"longest gap {out['longest_gap_s']:.2f} s, median {out['median_gap_s'] * 1e3:.1f} ms, "
        f"{len(slow)} rounds over 1 s (longest {max(slow, default=0):.2f} s)"
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
