"""The attention kernels compile for the H200 (sm_90) on any machine, as
test_sm90_compile.py's kernels do: the walks and their combine, the gathered and listed
decode attention, the siblings' causal attention, the indexer's scores, select and spread ranking,
and the block keys and cache writes.

    python -m pytest tests/kernels/test_sm90_compile_attention.py     # needs triton; no GPU
"""

from __future__ import annotations

import os
import struct

import pytest
import torch

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1", reason="the interpreter replaces the compiler"
)

from flashlane.kernels.attention import triton as attention  # noqa: E402
from flashlane.kernels.attention import (  # noqa: E402
    triton_blocks,
    triton_causal,
    triton_gather,
    triton_kv8,
    triton_listed,
    triton_scores,
    triton_select,
    triton_select_spread,
    triton_walk,
)
from tests.kernels.sm90 import BF, compiles_for_sm90  # noqa: E402

BLOCK_KEY = dict(BLOCK=4, DI=128, R=32, BDI=128)  # the indexer: blocks of 4, 128 dims
POOL_AT = dict(
    keys_ptr=BF,
    cos_ptr=BF,
    sin_ptr=BF,
    w_ptr=BF,
    out_ptr=BF,
    pos_ptr="*i64",
    tab_ptr="*i64",
    scale_ptr=BF,  # unused without FP8 (the keys themselves)
    nb="i32",
    has_table="i32",
    eps="fp32",
)
# --kv-cache-dtype fp8: e4m3 raw keys and their fp32 scales
POOL_AT_FP8 = dict(POOL_AT, keys_ptr="*fp8e4nv", scale_ptr="*fp32")
ATTENTION = dict(
    q_ptr=BF,
    k_ptr=BF,
    v_ptr=BF,
    mask_ptr="*u8",
    o_ptr=BF,
    len_ptr="*i64",
    tab_ptr="*i64",
    pos_ptr="*i64",
    ks_ptr="*fp32",
    vs_ptr="*fp32",
    pm_ptr="*fp32",
    pl_ptr="*fp32",
    pa_ptr="*fp32",
    HAS_LEN="i32",
    HAS_TABLE="i32",
    HAS_POS="i32",
    T="i32",
    L="i32",
    HQ="i32",
    HKV="i32",
    REP="i32",
    scale="fp32",
    split_keys="i32",
)
_BM, _BL, _WARPS, _STAGES, _PREC, _SKIP = attention.CONFIGS[torch.bfloat16]
ATTENTION_TILE = dict(D=256, BD=256, BLOCK_M=_BM, BLOCK_L=_BL, PRECISION=_PREC, SKIP=_SKIP)
# the gathered decode attention (kernels/attention/triton_gather.py): 12 q heads a kv head
GATHER = dict(
    q_ptr=BF, k_ptr=BF, v_ptr=BF, mask_ptr="*u8", o_ptr=BF, len_ptr="*i64", tab_ptr="*i64",
    pos_ptr="*i64", ks_ptr="*fp32", vs_ptr="*fp32", list_ptr="*i16", pm_ptr="*fp32",
    pl_ptr="*fp32", pa_ptr="*fp32", HAS_LEN="i32", HAS_TABLE="i32", HAS_POS="i32", T="i32",
    L="i32", HKV="i32", stride_b="i32", scale="fp32",
)  # fmt: skip
GATHER_TILE = dict(
    HQ=24, REP=12, D=256, BD=256, BLOCK_M=16, BLOCK_L=triton_gather.BLOCK_L,
    RANGE=triton_gather.RANGE_KEYS, CHUNK=triton_gather.CHUNK, PRECISION="tf32", FP8=False,
)  # fmt: skip
LISTED_FOLD = dict(
    q_ptr=BF, k_ptr=BF, v_ptr=BF, tab_ptr="*i64", ks_ptr="*fp32", vs_ptr="*fp32",
    list_ptr="*i16", count_ptr="*i32", pm_ptr="*fp32", pl_ptr="*fp32", pa_ptr="*fp32",
    HAS_TABLE="i32", T="i32", R="i32", HKV="i32", stride_b="i32", scale="fp32",
)  # fmt: skip
LISTED_TILE = dict(
    HQ=24, REP=12, D=256, BD=256, BLOCK_M=16, BLOCK_L=triton_gather.BLOCK_L, BR=64,
    RANGE=triton_listed.LIST_KEYS, STEPS=triton_listed.STEPS, SLICES=triton_listed.SLICES,
    PRECISION="tf32", FP8=False, PDL=1,
)  # fmt: skip
PDL_WARPS = dict(num_warps=4, launch_pdl=True)  # a launch that may start as the one before ends
INDEX = dict(
    iq_ptr=BF,
    keys_ptr=BF,
    scores_ptr="*fp32",
    tab_ptr="*i64",
    pos_ptr="*i64",
    HAS_TABLE="i32",
    HAS_POS="i32",
    T="i32",
    NB="i32",
    HI="i32",
    BLOCK="i32",
    sqrt_di="fp32",
)
SELECT = dict(
    scores_ptr="*fp32",
    pos_ptr="*i64",
    keep_ptr="*i8",
    mask_ptr="*i8",
    nb="i32",
    num_keys="i32",
)
SPREAD = dict(
    scores_ptr="*fp32",
    pos_ptr="*i64",
    nans_ptr="*i32",
    firsts_ptr="*i32",
    hist_ptr="*i32",
    keep_ptr="*i8",
    mask_ptr="*i8",
    nb="i32",
    num_keys="i32",
)

ATTENTION_KERNELS = {
    "select": (triton_select._select_kernel, SELECT,
               dict(BLOCK=4, TOP=512, CHUNK=1024, WHOLE=triton_select.WHOLE)),
    # benchmarks/attention_decode.py's WHOLE candidates, with the warps select_from_scores gives
    **{f"select whole {whole}": (triton_select._select_kernel, SELECT,
                                 dict(BLOCK=4, TOP=512, CHUNK=1024, WHOLE=whole),
                                 dict(num_warps=triton_select.whole_warps(whole)))
       for whole in (4096, 8192)},
    # the long rows' ranking spread over programs: the top byte's histograms (and a short
    # row whole), a lower byte's, the flags and the mask
    **{f"select spread {step}": (triton_select_spread._spread_kernel, SPREAD,
                                 dict(BLOCK=4, TOP=512, CHUNK=1024, WHOLE=triton_select.WHOLE,
                                      PASS=step, KEYS=triton_select_spread.MASK_KEYS))
       for step in (0, 3, 4)},
    "select spread whole 8192": (triton_select_spread._spread_kernel, SPREAD,
                                 dict(BLOCK=4, TOP=512, CHUNK=1024, WHOLE=8192, PASS=0,
                                      KEYS=triton_select_spread.MASK_KEYS),
                                 dict(num_warps=triton_select.whole_warps(8192))),
    "block_keys": (triton_blocks._block_keys_kernel,
                   dict(raw_ptr=BF, cos_ptr=BF, sin_ptr=BF, w_ptr=BF, out_ptr=BF,
                        stride_raw="i32", stride_out="i32", eps="fp32"), BLOCK_KEY),
    "pool_block_at": (triton_blocks._pool_block_at_kernel, POOL_AT, BLOCK_KEY),
    "pool_block_at fp8": (triton_blocks._pool_block_at_kernel, POOL_AT_FP8,
                          dict(BLOCK_KEY, FP8=True)),
    "put_three": (triton_blocks._put_three_kernel,
                  dict(s0=BF, d0=BF, s1=BF, d1=BF, s2=BF, d2=BF, tab_ptr="*i64", pos_ptr="*i64",
                       W0="i32", W1="i32", W2="i32", S0="i32", S1="i32", S2="i32"),
                  dict(C0=0, C1=1, C2=2, BLOCK=512, PDL=1), dict(launch_pdl=True)),
    "put_three fp8": (triton_blocks._put_three_kernel,  # an 8-bit cache's rows
                      dict(s0="*fp8e4nv", d0="*fp8e4nv", s1="*fp8e4nv", d1="*fp8e4nv",
                           s2="*fp8e4nv", d2="*fp8e4nv", tab_ptr="*i64", pos_ptr="*i64",
                           W0="i32", W1="i32", W2="i32", S0="i32", S1="i32", S2="i32"),
                      dict(C0=0, C1=1, C2=2, BLOCK=512, PDL=1), dict(launch_pdl=True)),
    "put_three scales": (triton_blocks._put_three_kernel,  # and their fp32 scales
                         dict(s0="*fp32", d0="*fp32", s1="*fp32", d1="*fp32", s2="*fp32",
                              d2="*fp32", tab_ptr="*i64", pos_ptr="*i64", W0="i32", W1="i32",
                              W2="i32", S0="i32", S1="i32", S2="i32"),
                         dict(C0=5, C1=6, C2=7, BLOCK=2, PDL=1), dict(launch_pdl=True)),
    # a decode step's rows quantized in the store (triton_kv8.put_quantized)
    "put_three8": (triton_kv8._put_three8_kernel,
                   dict(s0=BF, d0="*fp8e4nv", c0="*fp32", s1=BF, d1="*fp8e4nv", c1="*fp32",
                        s2=BF, d2="*fp8e4nv", c2="*fp32", tab_ptr="*i64", pos_ptr="*i64",
                        G0="i32", G1="i32", G2="i32", D0="i32", D1="i32", D2="i32",
                        S0="i32", S1="i32", S2="i32"),
                   dict(C0=0, C1=1, C2=2, SC0=5, SC1=6, SC2=7, BLOCK_G=2, BLOCK_D=256, PDL=1),
                   dict(launch_pdl=True)),
    "put_rows": (triton_blocks._put_rows_kernel,
                 dict(src_ptr=BF, dst_ptr=BF, tab_ptr="*i64", pos_ptr="*i64", W="i32"),
                 dict(COL=0, BLOCK=512)),
    "attention": (attention._attention_kernel, ATTENTION, ATTENTION_TILE,
                  dict(num_warps=_WARPS, num_stages=_STAGES)),
    # a decode window's walk: spans of SUPER blocks, their masks read once (SKIP)
    "attention decode": (attention._attention_kernel, ATTENTION, dict(ATTENTION_TILE, SKIP=True),
                         dict(num_warps=_WARPS, num_stages=_STAGES)),
    # a split decode walk's partials folded (kernels/attention/triton_walk.py)
    "attention combine": (triton_walk._combine_kernel,
                          dict(m_ptr="*fp32", l_ptr="*fp32", acc_ptr="*fp32", o_ptr=BF,
                               len_ptr="*i64", pos_ptr="*i64", HAS_LEN="i32", HAS_POS="i32",
                               rows="i32", S="i32", T="i32", L="i32", HQ="i32", RANGE="i32"),
                          dict(D=256, BD=256, ROWS=8), dict(num_warps=4)),
    # the gathered decode attention (kernels/attention/triton_gather.py): 12 q heads a kv head
    "attention gathered": (triton_gather._gather_kernel, GATHER, GATHER_TILE,
                           dict(num_warps=4)),
    "attention gathered fp8": (triton_gather._gather_kernel,
                               dict(GATHER, k_ptr="*fp8e4nv", v_ptr="*fp8e4nv"),
                               dict(GATHER_TILE, FP8=True), dict(num_warps=4)),
    # ... listed once a row, folded in slices (kernels/attention/triton_listed.py)
    "attention listed: list": (triton_listed._list_kernel,
                               dict(mask_ptr="*u8", len_ptr="*i64", pos_ptr="*i64",
                                    list_ptr="*i16", count_ptr="*i32", HAS_LEN="i32",
                                    HAS_POS="i32", T="i32", L="i32", R="i32"),
                               dict(RANGE=triton_listed.LIST_KEYS, CHUNK=triton_listed.CHUNK,
                                    PDL=1),
                               PDL_WARPS),
    "attention listed: fold": (triton_listed._fold_kernel, LISTED_FOLD, LISTED_TILE,
                               PDL_WARPS),
    "attention listed: fold fp8": (triton_listed._fold_kernel,
                                   dict(LISTED_FOLD, k_ptr="*fp8e4nv", v_ptr="*fp8e4nv"),
                                   dict(LISTED_TILE, FP8=True), PDL_WARPS),
    "attention listed: combine": (triton_listed._combine_kernel,
                                  dict(pm_ptr="*fp32", pl_ptr="*fp32", pa_ptr="*fp32",
                                       count_ptr="*i32", o_ptr=BF, R="i32", rows="i32",
                                       HQ="i32"),
                                  dict(BR=64, BLOCK_L=triton_gather.BLOCK_L,
                                       STEPS=triton_listed.STEPS, SLICES=triton_listed.SLICES,
                                       BS=triton_listed.SLICES, D=256, BD=256, PDL=1),
                                  PDL_WARPS),
    "attention fp8": (attention._attention_kernel,
                      dict(ATTENTION, k_ptr="*fp8e4nv", v_ptr="*fp8e4nv"),
                      dict(ATTENTION_TILE, FP8=True), dict(num_warps=_WARPS, num_stages=_STAGES)),
    # the siblings' gated full attention (Qwen3-Next: 16 q / 2 kv heads of 256)
    "causal_attention": (triton_causal._causal_kernel,
                         dict(q_ptr=BF, k_ptr=BF, v_ptr=BF, pos_ptr="*i64", o_ptr=BF,
                              len_ptr="*i64", tab_ptr="*i64", HAS_LEN="i32",
                              HAS_TABLE="i32", T="i32", L="i32", HQ="i32",
                              HKV="i32", REP="i32", scale="fp32"),
                         dict(ATTENTION_TILE, PDL=1),
                         dict(num_warps=_WARPS, num_stages=_STAGES, launch_pdl=True)),
    "index_scores": (triton_scores._index_scores_kernel, INDEX,
                     dict(DI=128, BDI=128, BLOCK_T=triton_scores.INDEX_TILE[0],
                          BLOCK_N=triton_scores.INDEX_TILE[1], PRECISION="tf32",
                          DECODE=False),
                     dict(num_warps=triton_scores.INDEX_TILE[2])),
    # decode rows: the block keys as the dot's rows, up to 16 query rows its columns
    "index_scores decode": (triton_scores._index_scores_kernel, INDEX,
                            dict(DI=128, BDI=128, BLOCK_T=triton_scores.DECODE_TILE[0],
                                 BLOCK_N=triton_scores.DECODE_TILE[1], PRECISION="tf32",
                                 DECODE=True),
                            dict(num_warps=triton_scores.DECODE_TILE[2])),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(ATTENTION_KERNELS))
def test_compiles_for_sm90(name):
    """With its pointers aligned, as a launch on torch's tensors specialises it (sm90.py)."""
    compiles_for_sm90(ATTENTION_KERNELS[name], aligned=True)


def test_rows_quantized_in_the_store_divide_as_torch():
    """triton_kv8's store quantizes as kv8.quantize does on a GPU: the values' division by
    their scale IEEE (div.rn, not the approximate div.full a plain `/` compiles to), the
    scale amax times fp32(1 / 448) as torch's division by a host scalar on a GPU (no
    division), and the GPU's cast to e4m3 (round to nearest even), whose bits the GPU test
    compares with torch's."""
    import re

    ptx = compiles_for_sm90(ATTENTION_KERNELS["put_three8"], aligned=True).asm["ptx"]
    assert set(re.findall(r"div\.[\w.]*f32", ptx)) == {"div.rn.f32"}
    inv = struct.unpack("<I", struct.pack("<f", 1.0 / 448.0))[0]
    assert re.search(rf"mul\.f32\s[^;]*0f{inv:08X}", ptx, re.IGNORECASE), "amax * (1 / 448)"
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx
