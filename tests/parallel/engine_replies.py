"""Run by test_engine_tp's slow test in a fresh process: an engine at the TP degree argv[1]
serves three seeded prompts together (drafts on), then each alone with drafts off (the
prompt cache resumes them), and prints every reply's token ids as JSON."""

from __future__ import annotations

import json
import sys

from flashlane import LLM, SamplingParams

LONG = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(12))  # past a 64-token mark
PROMPTS = ["def add(a, b):", "import os\n", LONG]


def main(size: int) -> None:
    llm = LLM(tensor_parallel_size=size, parallel=3, context=256, unpriced=True)
    params = [SamplingParams(max_tokens=14, temperature=0.8, seed=s) for s in (1, 2, 3)]
    together = [o.token_ids for o in llm.generate(PROMPTS, params)]
    undrafted = [
        SamplingParams(max_tokens=14, temperature=0.8, seed=s, draft=False) for s in (1, 2, 3)
    ]
    outs = [llm.generate(p, q)[0] for p, q in zip(PROMPTS, undrafted)]
    alone = [o.token_ids for o in outs]
    cached = sum(o.stats.cached_tokens for o in outs)
    print(json.dumps({"together": together, "alone": alone, "cached": cached}))


if __name__ == "__main__":
    main(int(sys.argv[1]))
