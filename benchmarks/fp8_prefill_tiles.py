"""Which FP8 prefill tiles stay on mma.sync, counted on any machine: the block-FP8 linear
(kernels/linear/triton_fp8.py) at Flash Next's 2560 x 6144 compiled for sm_90 as launched
(tests/kernels/sm90.compiles_for_sm90) at each candidate tile, its SASS counted: wgmma
(HGMMA) or mma.sync (HMMA), local-memory stores (spills), shared memory, all with bf16
activations. Written when a prompt row had to get a decode row's bits (16-row mma.sync
tiles; wgmma's differ: fp8_tile): a 64-row tile stays on mma.sync only on 2 warps, and then
spills. Prompt rows now have tiles of their own (kernels/row_kind.py: 64 x 128 on 8 warps,
e4m3 activations). No GPU needed.

    python benchmarks/fp8_prefill_tiles.py
"""

from __future__ import annotations

import collections
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import triton

from flashlane.kernels.linear import triton_fp8
from tests.kernels.sm90 import compiles_for_sm90, sass
from tests.kernels.test_sm90_compile_fp8 import LINEAR

# (rows, columns, warps, stages): today's prefill tile first
TILES = [(32, 128, 4, 3), (64, 64, 2, 3), (64, 128, 2, 3), (64, 128, 4, 3), (64, 128, 8, 3),
         (128, 64, 4, 3), (128, 128, 8, 3)]  # fmt: skip


def main() -> None:
    t = triton_fp8.fp8_tile(4096, 2560, 6144)
    rows = []
    print(f"{'tile':<16} {'HGMMA':>6} {'HMMA':>6} {'STL':>6} {'shared':>8}")
    for bm, bn, warps, stages in TILES:
        consts = dict(PARTS=t["PARTS"], BLOCKS_PER_PART=t["BLOCKS_PER_PART"],
                      SCALES=triton.next_power_of_2(t["BLOCKS_PER_PART"]), SPLIT=False,
                      FIXUP=False, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=triton_fp8.BLOCK,
                      IEEE=False, BY_BITS=True)  # fmt: skip
        entry = (triton_fp8._fp8_linear_kernel, LINEAR, consts,
                 dict(num_warps=warps, num_stages=stages))  # fmt: skip
        compiled = compiles_for_sm90(entry, aligned=True)
        ops = collections.Counter(
            re.findall(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", sass(compiled))
        )
        name = f"{bm}x{bn} w{warps} s{stages}"
        row = dict(tile=name, HGMMA=ops["HGMMA"], HMMA=ops["HMMA"], STL=ops["STL"],
                   shared=compiled.metadata.shared)  # fmt: skip
        rows.append(row)
        print(f"{name:<16} {row['HGMMA']:>6} {row['HMMA']:>6} {row['STL']:>6} {row['shared']:>8}")
    print(json.dumps(dict(bench="fp8_prefill_tiles", target="sm_90", tiles=rows)))


if __name__ == "__main__":
    main()
