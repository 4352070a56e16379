"""What the H200 would run, counted on any machine: every kernel of the sm_90 compile tables
(tests/kernels/test_sm90_compile*.py) compiled as a typical launch specialises it (pointers
16-byte aligned, specialised integers multiples of 16: tests/kernels/sm90.launch_attrs),
disassembled with the nvdisasm bundled with triton, and its instructions counted: local-memory
stores and loads (spills), global loads, async copies, tensor-core ops, all; and the spills
inside loops (between a label and a branch back to it: `in_loop`), the ones a walk over keys
or K blocks repeats. No GPU needed.

    python benchmarks/sass_census.py [--match attention] [--spills]

--spills lists only the kernels with local-memory traffic. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.kernels import (
    test_sm90_compile,
    test_sm90_compile_attention,
    test_sm90_compile_fp8,
    test_sm90_compile_gemm,
)
from tests.kernels.sm90 import compiles_for_sm90, in_loops, sass

COUNTED = ("STL", "LDL", "LDG", "LDGSTS", "STG", "HGMMA", "HMMA", "BAR")
OP = r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)"  # an instruction line's opcode


def census(entry: tuple) -> tuple[collections.Counter, int]:
    """Instruction names of `entry`'s launched variant and how often each appears, and how
    many local-memory stores and loads lie inside loops."""
    code = sass(compiles_for_sm90(entry, aligned=True))
    looped = collections.Counter(re.findall(OP, "\n".join(in_loops(code))))
    return collections.Counter(re.findall(OP, code)), looped["STL"] + looped["LDL"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--match", default="", help="only kernels whose name holds this (default all)")
    ap.add_argument("--spills", action="store_true", help="only kernels that spill (default off)")
    args = ap.parse_args()
    tables = {
        **test_sm90_compile.KERNELS,
        **test_sm90_compile_attention.ATTENTION_KERNELS,
        **test_sm90_compile_gemm.GEMMS,
        **test_sm90_compile_fp8.KERNELS,
    }
    rows = []
    print(f"{'kernel':<40} " + " ".join(f"{c:>6}" for c in COUNTED) + "   total  in_loop")
    for name in sorted(n for n in tables if args.match in n):
        ops, in_loop = census(tables[name])
        if args.spills and not (ops["STL"] or ops["LDL"]):
            continue
        counts = {c: ops[c] for c in COUNTED}
        rows.append(dict(kernel=name, total=sum(ops.values()), **counts, in_loop=in_loop))
        cells = " ".join(f"{ops[c]:>6}" for c in COUNTED)
        print(f"{name:<40} {cells} {sum(ops.values()):7} {in_loop:8}")
    print(json.dumps(dict(bench="sass_census", target="sm_90", kernels=rows)))


if __name__ == "__main__":
    main()
