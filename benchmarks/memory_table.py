"""How many streams fit beside Flash Next: equal full-window sessions against sized lists.

Computed from the memory plan of the real config (nothing is allocated): bf16 KV / indexer /
conv caches, fp32 GDN states, on the GPU, MTP layer cache included. For each budget left to
sessions (16, 32, 64 GiB), the number of sessions of each layout that fit; a sized list is
taken in its order (largest first). A second table takes the round's workspace (verify scratch
for 64 rows + logits + 1 GiB) out of the same budgets, as `plan` does.

    python benchmarks/memory_table.py [--config PATH] [--save]

Prints two markdown tables and ends with one JSON line; --save also writes
benchmarks/results/memory_table.json and benchmarks/memory_table.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from itertools import groupby
from pathlib import Path

from flashlane.models.config import ModelConfig
from flashlane.planning.memory import (
    GIB,
    activation_bytes,
    element_bytes,
    scratch_buffers,
    session_bytes,
)
from flashlane.sessions.slots import parse_slot_contexts

HERE = Path(__file__).resolve().parent
# the real Flash Next config.json, kept with the tests
DEFAULT_CONFIG = HERE.parent / "tests" / "data" / "flashnext_real_config.json"
BUDGETS_GIB = (16, 32, 64)
MAX_ROWS = 64
EQUAL = (262_144, 131_072, 65_536)
SIZED = (
    "65536,32768x3,16384x11",  # the seed's list
    "262144,65536x3,16384x12",  # one full-window session, the rest small
    "131072,65536x3,32768x12",
)


def fit_equal(budget: int, one: int) -> int:
    return max(0, budget // one)


def fit_list(budget: int, sizes: list[int]) -> int:
    """Sessions of the list that fit, taken in its order."""
    used = count = 0
    for size in sizes:
        used += size
        if used > budget:
            break
        count += 1
    return count


def layouts(cfg: ModelConfig) -> list[dict]:
    cache_b, state_b = element_bytes("cuda")
    out = []
    for context in EQUAL:
        one = session_bytes(cfg, context, cache_b, state_b)
        out.append({"layout": f"{context} x N", "sessions": None, "bytes": [one]})
    for text in SIZED:
        caps = parse_slot_contexts(text)
        sizes = [session_bytes(cfg, c, cache_b, state_b) for c in caps]
        out.append({"layout": text, "sessions": len(caps), "bytes": sizes})
    return out


def streams(layout: dict, budget: int) -> int:
    if layout["sessions"] is None:
        return fit_equal(budget, layout["bytes"][0])
    return fit_list(budget, layout["bytes"])


def table(rows: list[dict], budgets: list[int], labels: list[str], title: str) -> list[str]:
    head = "| layout | GiB per session (list total) | " + " | ".join(labels) + " |"
    lines = [f"**{title}**", "", head, "|---|---|" + "---|" * len(budgets)]
    for r in rows:
        size = r["bytes"][0] / GIB if r["sessions"] is None else sum(r["bytes"]) / GIB
        cells = [
            str(streams(r, b)) if r["sessions"] is None else f"{streams(r, b)} of {r['sessions']}"
            for b in budgets
        ]
        lines.append(f"| {r['layout']} | {size:.2f} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--save", action="store_true")
    args = parser.parse_args()
    cfg = ModelConfig.from_hf(args.config)
    cache_b, state_b = element_bytes("cuda")
    workspace = sum(b.nbytes for b in scratch_buffers(cfg, MAX_ROWS, cache_b, state_b))
    workspace += activation_bytes(cfg, MAX_ROWS, "cuda")
    rows = layouts(cfg)
    budgets = [g * GIB for g in BUDGETS_GIB]
    left = [b - workspace for b in budgets]
    ws = workspace / GIB
    lines = [
        *table(rows, budgets, [f"{g} GiB" for g in BUDGETS_GIB], "Streams that fit in a budget "
               "left to sessions"),
        "",
        *table(rows, left, [f"{g} - {ws:.2f} GiB" for g in BUDGETS_GIB], f"The same budgets with "
               f"the round's workspace ({ws:.2f} GiB at {MAX_ROWS} rows) also taken from them"),
    ]  # fmt: skip
    result = {
        "bench": "memory_table",
        "config": str(args.config.name),
        "device": "none (computed from the config: bf16 cache, fp32 state, GPU plan)",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "commit": _commit(),
        "command": "python " + " ".join(["benchmarks/memory_table.py", *sys.argv[1:]]),
        "workspace_bytes": workspace,
        "budgets_gib": list(BUDGETS_GIB),
        "layouts": [
            {
                "layout": r["layout"],
                "session_bytes": _runs(r["bytes"]),
                "streams": [streams(r, b) for b in budgets],
                "streams_after_workspace": [streams(r, b) for b in left],
            }
            for r in rows
        ],
    }
    print("\n".join(lines))
    print(json.dumps(result))
    if args.save:
        (HERE / "results").mkdir(exist_ok=True)
        (HERE / "results" / "memory_table.json").write_text(json.dumps(result, indent=1) + "\n")
        (HERE / "memory_table.md").write_text(_markdown(lines, result))


def _markdown(lines: list[str], result: dict) -> str:
    intro = (
        "## Sessions that fit beside Flash Next (memory plan, computed)\n\n"
        "From the memory plan of the real Flash Next config (`flashnext_real_config.json`), "
        "computed, not allocated: bf16 KV, indexer and conv caches, fp32 GDN states, the MTP "
        "layer's cache included. Equal sessions count how many fit; a sized list is taken in its "
        "order (largest first). No auto cap: `--parallel auto` stops at 16.\n\n"
        f"Command: `{result['command']}` at commit {result['commit']}, {result['date']}; "
        "results in `benchmarks/results/memory_table.json`.\n\n"
    )
    return intro + "\n".join(lines) + "\n"


def _runs(sizes: list[int]) -> list[list[int]]:
    """[bytes, count] runs of equal sessions."""
    return [[size, len(list(group))] for size, group in groupby(sizes)]


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


if __name__ == "__main__":
    main()
