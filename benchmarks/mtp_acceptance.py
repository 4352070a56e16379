"""MTP acceptance by depth under greedy decoding, with the engine's own drafter and target.

    PYTHONPATH=. python benchmarks/mtp_acceptance.py [--model DIR] [--docs 8] [--stride 64]

At prefixes of held-out stdlib files (training/corpus.py's split), the target's greedy
continuation g_0, g_1, ... is decoded one row at a time; the MTP head, after absorbing the
prefix and g_0, chains 4 drafts (no confidence cut). Depth d counts when drafts 1..d all equal
g_1..g_d (training/evaluate.py's chained_acceptance). Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from datetime import date

import torch

from flashlane.config import DEFAULT_MODEL
from flashlane.lanes.records import Draws, Window
from flashlane.models.loader import load_checkpoint
from flashlane.models.state import SessionState
from flashlane.request import SamplingParams
from flashlane.runner.backend import ModelBackend
from training import corpus
from training.evaluate import chained_acceptance

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


class Probe:
    def __init__(self, folder):
        self.cfg, self.model = load_checkpoint(folder, torch.float64)

    def _start(self, prefix: list[int]) -> tuple[ModelBackend, list[int]]:
        s = SessionState.empty(self.cfg, len(prefix) + 16, torch.float64, torch.float64)
        b = ModelBackend(self.model, [s], max_rows=16, mtp_confidence=0.0)
        pieces = [prefix[a : a + 64] for a in range(0, len(prefix), 64)]
        reply: list[int] = []  # shared with the windows' Draws, as the lane core does
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            w = Window(
                0,
                0,
                64 * i,
                tuple(piece),
                Draws(GREEDY, 0, prefix, reply),
                kind="prompt",
                last_piece=last,
            )
            v = b.verify([w])[0]
            if last:
                reply.append(v.sampled[0])
            b.keep({0: len(piece)})
        return b, reply

    def greedy(self, prefix: list[int], n: int) -> list[int]:
        b, out = self._start(prefix)
        while len(out) < n:
            w = Window(0, 0, len(prefix) + len(out) - 1, (out[-1],), Draws(GREEDY, 0, prefix, out))
            out.append(b.verify([w])[0].sampled[0])
            b.keep({0: 1})
        return list(out)

    def drafts(self, prefix: list[int], depth: int) -> list[int]:
        b, _ = self._start(prefix)
        return b.draft({0: depth})[0].tokens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--docs", type=int, default=8)
    ap.add_argument("--stride", type=int, default=64)
    ap.add_argument("--max-len", type=int, default=512)
    args = ap.parse_args()
    torch.set_num_threads(1)
    probe = Probe(args.model)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(f"{args.model}/tokenizer.json")
    held = [f for f in corpus.list_files() if f.split == "heldout"][: args.docs]
    docs = [tok.encode(d).ids[: args.max_len] for d in corpus.read_documents(held)]
    rates = chained_acceptance(probe.drafts, probe.greedy, docs, max_depth=4, stride=args.stride)
    print("depth  acceptance (all drafts up to it equal the greedy target)")
    for d, r in rates.items():
        print(f"{d:>5}  {r:.3f}")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(
        json.dumps(
            {
                "bench": "mtp_acceptance",
                "date": str(date.today()),
                "commit": commit,
                "model": args.model,
                "docs": len(docs),
                "stride": args.stride,
                "device": "cpu, 1 thread",
                "acceptance_by_depth": rates,
                "command": "PYTHONPATH=. python benchmarks/mtp_acceptance.py",
            }
        )
    )


if __name__ == "__main__":
    main()
