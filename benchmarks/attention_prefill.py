"""The QSA attention and indexer at prefill, tile configs side by side (issue 9: prefill at 8k).

At Flash Next's sizes (24 q heads over 2 kv heads of 256, indexer 4 x 128, blocks of 4, top
512), bf16, T query rows at positions 0..T-1 over their own T keys, a sparse mask from the
Triton indexer on random keys. For each attention config (BLOCK_M, BLOCK_L, warps, stages,
SKIP) with and without the rows' positions: the time at T rows, its rate on the dense causal
work, one decode row over all T keys, and its bits: rows of the full call against the same
rows in windows of 1, 7 and 64 rows (each must be equal), and the largest difference from the
first config. Then the indexer's scores (tensor-core dots) against torch's fp32 products
(the reference), and the mask from each.

    python benchmarks/attention_prefill.py [--tokens 8192] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from unittest import mock

import torch

from flashlane.bench.common import cuda_timed
from flashlane.kernels.attention import reference as attn_ref
from flashlane.kernels.attention import triton as attn
from flashlane.kernels.attention.triton_select import select_from_scores

HQ, HKV, D, HI, DI, BLOCK, TOP = 24, 2, 256, 4, 128, 4, 512

CONFIGS = [  # (BLOCK_M, BLOCK_L, warps, stages, SKIP), positions
    ((64, 32, 8, 2, True), False),  # before this session
    ((64, 32, 8, 2, True), True),
    ((64, 32, 8, 2, False), True),
    ((64, 32, 8, 3, False), True),
    ((64, 32, 4, 2, False), True),
    ((64, 32, 4, 3, False), True),
    ((64, 64, 4, 2, False), True),
    ((64, 64, 8, 2, False), True),
    ((64, 64, 8, 3, False), True),
    ((64, 64, 8, 2, True), True),
    ((128, 32, 8, 2, False), True),
    ((128, 32, 8, 3, False), True),
    ((128, 64, 8, 2, False), True),
    ((128, 64, 8, 2, True), True),
    ((64, 128, 8, 2, False), True),
    ((64, 16, 4, 3, False), True),
]


def timed(fn, reps: int = 5) -> float:
    return cuda_timed(fn, reps)


def module_settings(module, values: dict):
    """A module's settings set for a `with` block and restored after it (none: nothing)."""
    return mock.patch.multiple(module, **values) if values else contextlib.nullcontext()


def select_variants(scores, pos, t: int) -> list[dict]:
    """The mask's ranking at T rows in its ways (triton_select.py's module settings): the
    default (`rows_whole`), the spread ranking (decode's, whatever the rows), one program a row
    ranking up to WHOLE blocks in registers (longer rows in its loops over chunks), and one
    ranking up to 8,192 whatever the blocks; each timed and its mask against the default's."""
    from flashlane.kernels.attention import triton_select as sel

    want = select_from_scores(scores, pos, t, BLOCK, TOP)
    out = []
    for name, settings in (
        ("default", {}),
        ("spread", dict(SPREAD=True, SPREAD_ROWS=1 << 62)),
        ("one program a row", dict(SPREAD=False, SPREAD_ROWS=0, ROWS_WHOLE=sel.WHOLE)),
        # (rows_whole takes at least WHOLE, at most ROWS_WHOLE)
        (
            "one program a row, whole 8192",
            dict(SPREAD=False, SPREAD_ROWS=0, WHOLE=8192, ROWS_WHOLE=8192),
        ),
    ):
        try:
            with module_settings(sel, settings):
                same = torch.equal(select_from_scores(scores, pos, t, BLOCK, TOP), want)
                ms = timed(lambda: select_from_scores(scores, pos, t, BLOCK, TOP)) * 1e3
            out.append(dict(variant=name, ms=ms, same_mask=same))
            print(f"  select, {name}: {ms:.3f} ms, mask {'same' if same else 'OTHER'}")
        except Exception as e:  # out of registers or shared memory: say so and go on
            out.append(dict(variant=name, error=f"{type(e).__name__}: {str(e)[:120]}"))
            print(f"  select, {name}: {out[-1]['error']}")
    return out


def gathered_variants(q, k, v, mask, scale, pos, t: int) -> list[dict]:
    """Prompt rows through the decode kernels that read only each row's allowed keys
    (triton_gather.py by key ranges; triton_listed.py listed once a row, folded in slices,
    with its module settings): at a long prompt a row sees 2,048 keys where the walk loads
    every causal block. Each timed at T rows, its bits against the walk's default and its
    rows in windows against the whole call's."""
    from flashlane.kernels.attention import triton_gather as gather
    from flashlane.kernels.attention import triton_listed as listed

    walk = attn.attention(q, k, v, mask, scale, positions=pos)
    out = []
    for name, fn, settings in (
        ("gather by ranges", gather.attention_gathered, {}),
        ("listed, 32 slices of 2 steps", listed.attention_listed, {}),
        ("listed, 4 slices of 16 steps", listed.attention_listed, dict(SLICES=4, STEPS=16)),
        ("listed, one slice", listed.attention_listed, dict(SLICES=1, STEPS=64)),
    ):
        try:
            with module_settings(listed, settings):
                full = fn(q, k, v, mask, scale, positions=pos)
                ms = timed(lambda fn=fn: fn(q, k, v, mask, scale, positions=pos)) * 1e3
                same = True
                for a, w in ((0, 1), (t // 2, 7), (t - 64, 64), (t - 1, 1)):
                    n = a + w
                    part = fn(q[:, a:n], k[:, :n], v[:, :n], mask[:, a:n, :n], scale,
                              positions=pos[:, a:n])  # fmt: skip
                    same &= torch.equal(part, full[:, a:n])
            diff = (full.float() - walk.float()).abs().max().item()
            out.append(dict(variant=name, ms=ms, row_invariant=same, max_diff_vs_walk=diff))
            print(f"  {name}: {ms:.3f} ms, rows alone {same}, largest diff vs walk {diff:.2e}")
            del full
        except Exception as e:  # out of memory or registers: say so and go on
            out.append(dict(variant=name, error=f"{type(e).__name__}: {str(e)[:120]}"))
            print(f"  {name}: {out[-1]['error']}")
        finally:
            torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--json", default="")
    ap.add_argument("--select-only", action="store_true", help="skip the attention tiles")
    ap.add_argument(
        "--gathered", action="store_true", help="time the gathering kernels, not the tiles"
    )
    args = ap.parse_args()
    t = args.tokens
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, device="cuda").to(torch.bfloat16)

    q, k, v = rnd(1, t, HQ, D), rnd(1, t, HKV, D), rnd(1, t, HKV, D)
    iq, keys = rnd(1, t, HI, DI), rnd(1, t // BLOCK, DI)
    pos = torch.arange(t, device="cuda").view(1, t)
    mask = attn.select_mask(iq, keys, pos, t, BLOCK, TOP)
    scale = D**-0.5
    dense_flops = 4 * HQ * D * t * (t + 1) / 2  # causal QK^T and PV, 2 per multiply-add
    rows = []
    first = None
    print(
        f"attention at {t} rows (dense causal work {dense_flops / 1e12:.2f} TFLOP); mask "
        f"density {mask.float().mean().item() * 2:.3f} of causal"
    )
    print(
        f"{'BM':>4} {'BL':>4} {'w':>2} {'st':>2} {'skip':>5} {'pos':>4} {'ms':>8} "
        f"{'TF/s':>6} {'dec us':>7} {'bits':>5} {'vs first':>9}"
    )
    if args.gathered:
        walk_ms = timed(lambda: attn.attention(q, k, v, mask, scale, positions=pos)) * 1e3
        print(f"  the walk, default tile: {walk_ms:.3f} ms")
        rows.append(dict(variant="walk", ms=walk_ms))
        rows += gathered_variants(q, k, v, mask, scale, pos, t)
    for cfg5, with_pos in [] if args.select_only or args.gathered else CONFIGS:
        cfg = (*cfg5[:4], "tf32", cfg5[4])
        p = pos if with_pos else None
        row = dict(config=list(cfg5), positions=with_pos)
        try:
            full = attn.attention(q, k, v, mask, scale, positions=p, config=cfg)
            sec = timed(
                lambda p=p, cfg=cfg: attn.attention(q, k, v, mask, scale, positions=p, config=cfg)
            )
            pl = None if p is None else p[:, t - 1 :]
            dec = timed(
                lambda pl=pl, cfg=cfg: attn.attention(
                    q[:, t - 1 :], k, v, mask[:, t - 1 :], scale, positions=pl, config=cfg
                ),
                20,
            )
            same = True
            for a, w in ((0, 1), (t // 2, 7), (t - 64, 64), (t - 1, 1), (1234 % t, 1)):
                n = a + w
                part = attn.attention(
                    q[:, a:n],
                    k[:, :n],
                    v[:, :n],
                    mask[:, a:n, :n],
                    scale,
                    positions=None if p is None else p[:, a:n],
                    config=cfg,
                )
                same &= torch.equal(part, full[:, a:n])
            if first is None:
                first = full
            diff = (full.float() - first.float()).abs().max().item()
            row.update(
                ms=sec * 1e3,
                tflops=dense_flops / sec / 1e12,
                decode_us=dec * 1e6,
                row_invariant=same,
                max_diff_vs_first=diff,
            )
            print(
                f"{cfg5[0]:4d} {cfg5[1]:4d} {cfg5[2]:2d} {cfg5[3]:2d} {cfg5[4]!s:>5} "
                f"{with_pos!s:>4} {sec * 1e3:8.3f} {dense_flops / sec / 1e12:6.1f} "
                f"{dec * 1e6:7.1f} {same!s:>5} {diff:9.2e}"
            )
        except Exception as e:  # out of shared memory or registers: say so and go on
            row.update(error=f"{type(e).__name__}: {str(e)[:120]}")
            print(f"{cfg5} positions={with_pos}: {row['error']}")
        rows.append(row)

    # the indexer's scores: tensor-core tiles against torch's fp32 products
    idx = {}
    dots = attn.index_scores(iq, keys)
    torch_fp32 = attn_ref.index_scores(iq, keys)
    idx["dots_ms"] = timed(lambda: attn.index_scores(iq, keys)) * 1e3
    idx["torch_fp32_ms"] = timed(lambda: attn_ref.index_scores(iq, keys)) * 1e3
    idx["max_rel_diff"] = ((dots - torch_fp32).abs().max() / torch_fp32.abs().max()).item()
    inv = all(
        torch.equal(attn.index_scores(iq[:, a : a + w], keys), dots[:, a : a + w])
        for a, w in ((0, 1), (t // 2, 7), (t - 64, 64), (t - 1, 1))
    )
    idx["dots_row_invariant"] = inv
    r_mask = select_from_scores(torch_fp32, pos, t, BLOCK, TOP)
    idx["masks_equal"] = torch.equal(r_mask, mask)
    idx["mask_rows_differing"] = int((r_mask != mask).any(-1).sum().item())
    idx["select_ms"] = timed(lambda: select_from_scores(dots, pos, t, BLOCK, TOP)) * 1e3
    print(
        f"indexer scores at {t} rows: dots {idx['dots_ms']:.3f} ms, torch fp32 "
        f"{idx['torch_fp32_ms']:.3f} ms (largest difference {idx['max_rel_diff']:.1e} of the "
        f"largest score; dots row invariant {inv}; masks equal {idx['masks_equal']}, rows "
        f"differing {idx['mask_rows_differing']}); select {idx['select_ms']:.3f} ms"
    )
    idx["select_variants"] = select_variants(dots, pos, t)
    result = dict(
        bench="attention_prefill",
        tokens=t,
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        date=time.strftime("%Y-%m-%d"),
        attention=rows,
        indexer=idx,
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
