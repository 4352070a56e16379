"""QSA attention for decode rows at long contexts (issue 29): the indexer's mask and the
attention walks side by side, per layer.

At Flash Next's sizes (24 q heads over 2 kv heads of 256, indexer 4 x 128, blocks of 4, top
512: 2,048 selected keys), bf16, B sessions of one decode row each at the last position of a
C-key cache (random keys, the mask from the Triton indexer): the indexer's scores and its
select (the radix threshold past 2,048 blocks; one program a row, and spread over programs,
triton_select_spread.py, which must give the same mask), then the attention as the plain
walk (every key block loaded), the skipping walk (spans of 8 blocks, one mask load a span),
the split walk (ranges of SPLIT_KEYS keys, one program each, folded) at several SPLIT_KEYS,
the gathered attention (triton_gather.py: each range's allowed keys listed, only those read)
at the same range sizes, and the listed attention (triton_listed.py: a row's allowed keys
listed once, folded in slices) at several (SLICES, STEPS, warps). For each: microseconds replayed
from a CUDA graph (as the engine's graphed steps run them; `launched_us`: launched from
Python), and the rate of reading the selected keys and values (the layer's attention bytes
a step must read) against the copy bandwidth measured here. Checks: the split walk, the
gathered and the listed within bf16's tolerance of the plain one, and each session's row
alone equal bit for bit to the batched row.

    python benchmarks/attention_decode.py [--contexts 16384,65536,131072] [--streams 1,4,16]
        [--capacity 71808] [--kv8]

`layer_us`: the step's whole QSA attention as the engine runs it by default (decode rows'
scores of the blocks below the rows' positions, the select, the gathered attention);
`layer_listed_us`:
the same with triton_listed.LISTED on, `layer_loop_us` with triton_scores.PROGRAMS at 528
(programs looping over tiles), `layer_listed_loop_us` both; `--capacity`: sessions of that
many positions, as the engine's (`bench model`: 71,808), the rows still at the context's
last position. `scores_us` scores every block of the capacity in prompt rows' tile,
`scores_decode_us` in decode rows'; `select_whole{N}_us`: the
default select with rows of up to N complete blocks ranked from one load in registers
(triton_select.WHOLE candidates, each checked against the mask). `--kv8`: also the listed
attention over 8-bit copies of the caches (kv8.quantize) with each of its fold's launch
options (KV8_FOLDS, triton_listed.FOLD_OPTIONS8), timed and their bits compared.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.attention_prefill import module_settings
from flashlane.bench.common import commit, cuda_timed, graph_timed
from flashlane.kernels.attention import (
    kv8,
    triton_gather,
    triton_listed,
    triton_scores,
    triton_select,
    triton_walk,
)
from flashlane.kernels.attention import triton as attn
from flashlane.kernels.attention.triton_select import select_from_scores

HQ, HKV, D, HI, DI, BLOCK, TOP = 24, 2, 256, 4, 128, 4, 512
SPLITS = (1024, 2048, 4096)
WHOLES = (2048, 4096, 8192)  # triton_select.WHOLE candidates (select_whole*_us)
# triton_listed's (SLICES, STEPS, FOLD_WARPS) candidates
LISTED = ((16, 4, 4), (32, 2, 4), (64, 1, 4), (32, 2, 8))
# the layer by default and with the candidates: (name, triton_listed.LISTED,
# triton_scores.PROGRAMS: 528, four programs an SM on the H200)
LAYERS = (
    ("layer_us", False, 0),
    ("layer_listed_us", True, 0),
    ("layer_loop_us", False, 528),
    ("layer_listed_loop_us", True, 528),
)
VARIANTS = [f"split{s}" for s in SPLITS] + [f"gather{s}" for s in SPLITS]
VARIANTS += [f"listed{n}x{steps}w{warps}" for n, steps, warps in LISTED]
# --kv8: the listed fold's launch options over an 8-bit cache (triton_listed.FOLD_OPTIONS8)
KV8_FOLDS = {
    "default": {},
    "s1": dict(num_stages=1),
    "w8s2": dict(num_warps=8, num_stages=2),
    "w8s1": dict(num_warps=8, num_stages=1),
    # steps of 16 keys, 4 a slice (other bits): no local memory on sm_90
    "l16": dict(BLOCK_L=16, STEPS=4),
    "l16s1": dict(BLOCK_L=16, STEPS=4, num_stages=1),
    "l16w8s1": dict(BLOCK_L=16, STEPS=4, num_warps=8, num_stages=1),
}


def rows(x, i):
    """Batch row i of x (None: every row)."""
    return x if i is None else x[i : i + 1]


def timed(fn, reps: int = 20) -> float:
    """Seconds a call takes replayed from a CUDA graph (the GPU's time, as in the engine's
    graphed steps); the host's launch time is `launched` apart."""
    return graph_timed(fn, reps)


def launched(fn, reps: int = 20) -> float:
    """Seconds a call takes launched from Python, each call between two events."""
    return cuda_timed(fn, reps)


def copy_bandwidth() -> float:
    """Bytes a second of a 1 GiB device-to-device copy."""
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    return 2 * x.numel() / launched(lambda: y.copy_(x), 5)


def one(c: int, b: int, bw: float, capacity: int = 0, with_kv8: bool = False) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(c + b)
    cap = max(c, capacity)  # the sessions' positions: keys past the context are never read

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, device="cuda").to(torch.bfloat16)

    q, k, v = rnd(b, 1, HQ, D), rnd(b, cap, HKV, D), rnd(b, cap, HKV, D)
    iq, keys = rnd(b, 1, HI, DI), rnd(b, cap // BLOCK, DI)
    pos = torch.full((b, 1), c - 1, device="cuda")
    scale = D**-0.5
    # what a step runs by default: the scores of blocks below the rows' positions, the
    # select, the gathered attention; then with each candidate, and both
    layers, outs = {}, {}
    for name, listed, programs in LAYERS:
        triton_listed.LISTED, triton_scores.PROGRAMS = listed, programs

        def layer():
            mask = attn.select_mask(iq, keys, pos, cap, BLOCK, TOP, decode=True)
            return attn.attention(q, k, v, mask, scale, positions=pos, split=True)

        outs[name] = layer()
        layers[name] = timed(layer) * 1e6
    triton_listed.LISTED, triton_scores.PROGRAMS = False, 0
    # the loop over tiles changes no score: the same bits as one program a tile
    layers["loop_equal"] = torch.equal(outs["layer_loop_us"], outs["layer_us"]) and torch.equal(
        outs["layer_listed_loop_us"], outs["layer_listed_us"]
    )
    scores = attn.index_scores(iq, keys)
    spread_default = triton_select.SPREAD
    triton_select.SPREAD = False  # one program a row (--kernels walk), then spread
    mask = select_from_scores(scores, pos, cap, BLOCK, TOP)
    selected = mask.sum().item() / b  # keys a row reads
    need = b * selected * HKV * D * 2 * 2  # K and V in bf16
    out = dict(context=c, capacity=cap, streams=b, selected_keys=selected, **layers)
    out["scores_us"] = timed(lambda: attn.index_scores(iq, keys)) * 1e6
    # decode rows' own tile (triton_scores.DECODE_TILE: the block keys as the dot's rows), as
    # the engine's decode rows score (its bits differ from the prompt tile's, its mask may too)
    out["scores_decode_us"] = timed(lambda: attn.index_scores(iq, keys, decode=True)) * 1e6
    out["select_us"] = timed(lambda: select_from_scores(scores, pos, cap, BLOCK, TOP)) * 1e6
    triton_select.SPREAD = True  # the long rows' ranking spread over programs
    spread_keys, triton_select.SPREAD_KEYS = triton_select.SPREAD_KEYS, 0  # at any length
    spread = select_from_scores(scores, pos, cap, BLOCK, TOP)
    out["select_spread_us"] = timed(lambda: select_from_scores(scores, pos, cap, BLOCK, TOP)) * 1e6
    out["select_spread_equal"] = torch.equal(spread, mask)
    triton_select.SPREAD, triton_select.SPREAD_KEYS = spread_default, spread_keys
    # the default select with rows of up to WHOLE blocks ranked in registers (a candidate)
    whole_default = triton_select.WHOLE
    for whole in WHOLES:
        triton_select.WHOLE = whole
        got = select_from_scores(scores, pos, cap, BLOCK, TOP)
        out[f"select_whole{whole}_us"] = (
            timed(lambda: select_from_scores(scores, pos, cap, BLOCK, TOP)) * 1e6
        )
        out[f"select_whole{whole}_equal"] = torch.equal(got, mask)
    triton_select.WHOLE = whole_default
    plain_cfg = attn.CONFIGS[torch.bfloat16]
    plain = attn.attention(q, k, v, mask, scale, positions=pos, config=plain_cfg)
    walks = {
        "plain": lambda: attn.attention(q, k, v, mask, scale, positions=pos, config=plain_cfg),
        "skip": lambda: attn.attention(q, k, v, mask, scale, positions=pos),
    }
    for name, fn in walks.items():
        sec = timed(fn)
        out[f"{name}_us"] = sec * 1e6
        out[f"{name}_of_bw"] = need / sec / bw

    def variant(fn) -> dict:
        """fn(i) -> the call on batch row i alone, fn(None) -> on all rows."""
        got = fn(None)
        sec = timed(lambda: fn(None))
        host = launched(lambda: fn(None))
        alone = all(torch.equal(fn(i), got[i : i + 1]) for i in range(b))
        diff = (got.float() - plain.float()).abs().max().item()
        return dict(
            us=sec * 1e6, of_bw=need / sec / bw, launched_us=host * 1e6, alone_equal=alone,
            max_diff_vs_plain=diff,
        )  # fmt: skip

    gather_default, attn.GATHER = attn.GATHER, False  # split=True: the split walk
    for keys_a_range in SPLITS:
        triton_walk.SPLIT_KEYS = keys_a_range
        out[f"split{keys_a_range}"] = variant(
            lambda i: attn.attention(
                rows(q, i), rows(k, i), rows(v, i), rows(mask, i), scale,
                positions=rows(pos, i), split=True,
            )
        )  # fmt: skip
    for keys_a_range in SPLITS:
        triton_gather.RANGE_KEYS = keys_a_range
        out[f"gather{keys_a_range}"] = variant(
            lambda i: triton_gather.attention_gathered(
                rows(q, i), rows(k, i), rows(v, i), rows(mask, i), scale, positions=rows(pos, i)
            )
        )
    triton_gather.RANGE_KEYS = 2048
    slices_default = triton_listed.SLICES, triton_listed.STEPS, triton_listed.FOLD_WARPS
    for n, steps, warps in LISTED:
        triton_listed.SLICES, triton_listed.STEPS, triton_listed.FOLD_WARPS = n, steps, warps
        out[f"listed{n}x{steps}w{warps}"] = variant(
            lambda i: triton_listed.attention_listed(
                rows(q, i), rows(k, i), rows(v, i), rows(mask, i), scale, positions=rows(pos, i)
            )
        )
    triton_listed.SLICES, triton_listed.STEPS, triton_listed.FOLD_WARPS = slices_default
    attn.GATHER = gather_default
    triton_walk.SPLIT_KEYS = 2048
    if with_kv8:
        out["kv8"] = kv8_folds(q, k, v, mask, scale, pos)
    return out


def kv8_folds(q, k, v, mask, scale, pos) -> dict:
    """The listed attention over an 8-bit copy of the caches (kv8.quantize, as the engine's
    default with FP8 weights) with each KV8_FOLDS launch option of its fold
    (triton_listed.FOLD_OPTIONS8): microseconds, each session alone equal to the batch, and
    whether the options keep the default's bits."""
    (k8, ks), (v8, vs) = kv8.quantize(k), kv8.quantize(v)
    out, first = {}, None

    def call(i):
        return triton_listed.attention_listed(
            rows(q, i), rows(k8, i), rows(v8, i), rows(mask, i), scale,
            positions=rows(pos, i), scales=(rows(ks, i), rows(vs, i)),
        )  # fmt: skip

    for name, opts in KV8_FOLDS.items():
        with module_settings(triton_listed, dict(FOLD_OPTIONS8=opts)):
            got = call(None)
            first = got if first is None else first
            out[name] = dict(
                us=timed(lambda: call(None)) * 1e6,
                alone_equal=all(torch.equal(call(i), got[i : i + 1]) for i in range(q.shape[0])),
                bits_as_default=torch.equal(got, first),
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="16384,65536,131072")
    ap.add_argument("--streams", default="1,4,16")
    ap.add_argument("--capacity", type=int, default=0, help="session positions (>= context)")
    ap.add_argument("--kv8", action="store_true", help="also the 8-bit cache's fold options")
    args = ap.parse_args()
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s; us a layer (of the selected KV's roofline)")
    head = (
        f"{'ctx':>7} {'B':>3} {'layer':>7} {'listed':>7} {'loop':>7} {'both':>7} "
        f"{'scores':>7} {'decode':>7} {'select':>7} {'spread':>7} "
        f"{'plain':>14} {'skip':>14}"
    )
    print(head + "".join(f" {name:>16}" for name in VARIANTS) + "  checks")
    rows = []
    for c in (int(x) for x in args.contexts.split(",")):
        for b in (int(x) for x in args.streams.split(",")):
            r = one(c, b, bw, args.capacity, args.kv8)
            rows.append(r)
            splits = [r[name] for name in VARIANTS]
            ok = r["select_spread_equal"] and all(r[f"select_whole{w}_equal"] for w in WHOLES)
            ok = ok and r["loop_equal"]
            ok = ok and all(s["alone_equal"] and s["max_diff_vs_plain"] < 0.05 for s in splits)
            print(
                f"{c:7d} {b:3d} {r['layer_us']:7.1f} {r['layer_listed_us']:7.1f} "
                f"{r['layer_loop_us']:7.1f} {r['layer_listed_loop_us']:7.1f} "
                f"{r['scores_us']:7.1f} {r['scores_decode_us']:7.1f} {r['select_us']:7.1f} "
                f"{r['select_spread_us']:7.1f} "
                f"{r['plain_us']:7.1f} ({r['plain_of_bw']:4.0%}) "
                f"{r['skip_us']:7.1f} ({r['skip_of_bw']:4.0%})"
                + "".join(f" {s['us']:8.1f} ({s['of_bw']:4.0%})" for s in splits)
                + f"  {'ok' if ok else 'FAILED'}"
                + "  select by WHOLE "
                + " / ".join(f"{r[f'select_whole{w}_us']:.1f}" for w in WHOLES)
            )
            if args.kv8:  # us, then: A alone == batched, = the default's bits
                print("  kv8 fold: " + ", ".join(
                    f"{n} {x['us']:.1f} us{' A' if x['alone_equal'] else ' !A'}"
                    f"{' =' if x['bits_as_default'] else ' !='}" for n, x in r["kv8"].items()
                ))  # fmt: skip
    print(
        json.dumps(
            dict(
                bench="attention_decode",
                commit=commit(),
                date=time.strftime("%Y-%m-%d"),
                device=torch.cuda.get_device_name(),
                copy_bandwidth=bw,
                rows=rows,
            )
        )
    )


if __name__ == "__main__":
    main()
