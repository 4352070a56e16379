"""The indexer's scores for decode rows at long contexts (issue 29), tile by tile.

At Flash Next's indexer sizes (4 heads x 128, blocks of 4), bf16, B sessions of T decode rows
(T = 1: a lone step; T = 3: a verify window of two drafts) at the last positions of a C-key
cache: the scores of every complete block below the rows, as a step computes them, in the
prompt rows' tile (INDEX_TILE) and in each decode tile candidate (DECODE_TILE: query rows a
dot's columns, block keys its rows, warps). For each: microseconds replayed from a CUDA graph,
and the rate of reading the block keys against the copy bandwidth measured here. Checks, each
candidate: within fp32 rounding of the prompt tile; each session's rows alone equal bit for bit
to the batch's (row invariance); the mask the select ranks from them, keys that differ from
the prompt tile's (near ties only).

    python benchmarks/decode_scores.py [--contexts 16384,65536,131072] [--streams 1,4,16]
        [--rows 1,3] [--tiles 16x64x4,16x64x4x2@1056,16x256x8]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from attention_decode import copy_bandwidth

from flashlane.bench.common import commit, graph_timed
from flashlane.kernels.attention import triton_scores
from flashlane.kernels.attention.triton_scores import index_scores
from flashlane.kernels.attention.triton_select import select_from_scores

HI, DI, BLOCK, TOP = 4, 128, 4, 512


def tile_name(tile: tuple) -> str:
    dims, programs = tile
    return "x".join(map(str, dims)) + f"@{programs}"


def parse_tile(text: str) -> tuple:
    """'16x64x4' (query rows x block keys x warps[x stages]) [@programs, default PROGRAMS]."""
    dims, _, programs = text.partition("@")
    return tuple(int(v) for v in dims.split("x")), int(programs or triton_scores.PROGRAMS)


def one(c: int, b: int, t: int, tiles: list[tuple], bw: float) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(c + b + t)
    iq = torch.randn(b, t, HI, DI, generator=gen, device="cuda").to(torch.bfloat16)
    keys = torch.randn(b, c // BLOCK, DI, generator=gen, device="cuda").to(torch.bfloat16)
    pos = (c - t + torch.arange(t, device="cuda")).expand(b, t).contiguous()
    nb = c // BLOCK  # the blocks the last row ranks
    key_bytes = b * nb * DI * 2

    def scores(decode: bool) -> torch.Tensor:
        return index_scores(iq, keys, positions=pos, block=BLOCK, decode=decode)

    prompt = scores(False)
    prompt_mask = select_from_scores(prompt, pos, c, BLOCK, TOP)
    us = graph_timed(lambda: scores(False), 20) * 1e6
    row = dict(context=c, streams=b, rows=t, prompt_us=us, prompt_of_bw=key_bytes / us / bw * 1e6)
    default = triton_scores.DECODE_TILE, triton_scores.DECODE_PROGRAMS
    try:
        for tile in tiles:
            triton_scores.DECODE_TILE, triton_scores.DECODE_PROGRAMS = tile
            name = tile_name(tile)
            got = scores(True)
            us = graph_timed(lambda: scores(True), 20) * 1e6
            alone = all(
                torch.equal(
                    index_scores(iq[i : i + 1], keys[i : i + 1], positions=pos[i : i + 1],
                                 block=BLOCK, decode=True)[0, :, :nb],
                    got[i, :, :nb],
                )
                for i in range(b)
            )  # fmt: skip
            mask = select_from_scores(got, pos, c, BLOCK, TOP)
            row[name] = dict(
                us=us,
                of_bw=key_bytes / us / bw * 1e6,
                max_rel=float(
                    (got[..., :nb] - prompt[..., :nb]).abs().max() / prompt[..., :nb].abs().max()
                ),
                alone_equal=alone,
                mask_keys_differ=int((mask != prompt_mask).sum()),
            )
    finally:
        triton_scores.DECODE_TILE, triton_scores.DECODE_PROGRAMS = default
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--contexts", default="16384,65536,131072")
    ap.add_argument("--streams", default="1,4,16")
    ap.add_argument("--rows", default="1,3")
    ap.add_argument("--tiles", default="16x64x4,16x128x4,16x128x8,16x256x8")
    args = ap.parse_args()
    tiles = [parse_tile(s) for s in args.tiles.split(",")]
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s; decode rows' scores, us a layer (of bw)")
    names = [tile_name(tile) for tile in tiles]
    print(f"{'ctx':>7} {'B':>3} {'T':>2} {'prompt':>13}" + "".join(f" {n:>22}" for n in names))
    rows = []
    for c in (int(v) for v in args.contexts.split(",")):
        for b in (int(v) for v in args.streams.split(",")):
            for t in (int(v) for v in args.rows.split(",")):
                r = one(c, b, t, tiles, bw)
                rows.append(r)
                cells = "".join(
                    f" {r[n]['us']:7.1f} ({r[n]['of_bw']:4.0%}) "
                    f"{'=' if r[n]['alone_equal'] else '!'}{r[n]['mask_keys_differ']:>5}"
                    for n in names
                )
                print(
                    f"{c:7d} {b:3d} {t:2d} {r['prompt_us']:6.1f} ({r['prompt_of_bw']:4.0%})" + cells
                )
    print("(= a session alone equals its batch row bit for bit; then the mask's keys that differ"
          " from the prompt tile's)")  # fmt: skip
    out = dict(
        bench="decode_scores",
        date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        commit=commit(),
        device=torch.cuda.get_device_name(),
        copy_bandwidth=bw,
        default_tile=tile_name((triton_scores.DECODE_TILE, triton_scores.DECODE_PROGRAMS)),
        rows=rows,
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
