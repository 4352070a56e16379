"""QSA attention in today's 64-row tiles against one token's heads a tile (issue 9, the
experiment `attention._TOKEN_TILES`): Flash Next's attention layer (24 query heads over 2 kv
heads of 256, the indexer's top 512 blocks of 4 keys) at a long prompt piece, a verify
window and a decode row, with masks from the indexer on random keys. Each side timed as 3
calls in one CUDA graph; the outputs compared bitwise ("same" / "OTHER"). GPU only; prints a
table and one JSON line.

    python benchmarks/attention_tiles.py
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_linears import timed
from flashlane.kernels.attention import triton as attn

HQ, HKV, D, HI, DI, BLOCK, TOP = 24, 2, 256, 4, 128, 4, 512
CASES = [(8192, 8192), (2048, 8192), (8, 8192), (1, 8192), (1, 128)]  # (queries, keys)


def main() -> None:
    torch.manual_seed(0)
    d, bf = "cuda", torch.bfloat16
    results = []
    for t, l in CASES:
        q = torch.randn(1, t, HQ, D, device=d).to(bf)
        k = torch.randn(1, l, HKV, D, device=d).to(bf)
        v = torch.randn(1, l, HKV, D, device=d).to(bf)
        iq = torch.randn(1, t, HI, DI, device=d).to(bf)
        keys = torch.randn(1, l // BLOCK, DI, device=d).to(bf)
        pos = torch.arange(l - t, l, device=d)[None]
        mask = attn.select_mask(iq, keys, pos, l, BLOCK, TOP)
        call = partial(attn.attention, q, k, v, mask, D**-0.5)
        flops = 4.0 * HQ * D * float(mask.sum())  # the keys each query may see
        row = dict(queries=t, keys=l)
        for name, flag in (("64-row tiles", False), ("token tiles", True)):
            attn._TOKEN_TILES = flag
            try:
                row[name] = 1e6 * timed(call, d, 3)
                out = call()
            finally:
                attn._TOKEN_TILES = False
            row.setdefault("outs", []).append(out)
        a, b = row.pop("outs")
        row["same"] = torch.equal(a, b)
        results.append(row)
        print(f"  {t:>5} queries x {l:>5} keys: 64-row tiles {row['64-row tiles']:9.1f} us, "
              f"token tiles {row['token tiles']:9.1f} us "
              f"({flops / row['token tiles'] / 1e6:6.1f} TFLOP/s of visible keys) "
              f"{'same' if row['same'] else 'OTHER'}")
    print(json.dumps(dict(bench="attention_tiles", results=results)))


if __name__ == "__main__":
    main()
