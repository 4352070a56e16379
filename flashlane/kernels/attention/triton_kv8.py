"""An 8-bit cache's row writes in one launch (kernels/attention/kv8.py's arithmetic): a decode
step's keys, values and raw indexer keys quantized and stored with their scales, each row in
its own session's buffers through the session table (session_tables.attn_table), where
torch's quantize took ~16 launches a layer (~25 us of a one-stream step on the H100,
timeline_flashnext-12l_fp8_1streams_71808_h100_588eb7c).

The same bits as kv8.quantize on a GPU: a group's amax is exact; its scale amax / 448 is, in
torch on a GPU, amax times fp32(1 / 448) (ATen's true division by a host scalar multiplies
by its reciprocal; on the CPU it divides), so here too; the values' division by the scale
is IEEE (`div_rn`, as torch's division of two tensors), the quotient clamped to +-448 and
cast to e4m3 by the GPU's cvt (round to nearest even, as torch's cast). The interpreter's
fp32 -> e4m3 cast is wrong (kernels/linear/act_quant.py), so there `put_quantized` quantizes
in torch and copies.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.attention import kv8
from flashlane.kernels.pdl import enter, pdl
from flashlane.kernels.session_tables import TABLE_COLUMNS
from flashlane.kernels.tables import TABLE_WIDTH

__all__ = ["COLUMNS", "put_quantized", "store"]

# the buffers a store writes, in `store`'s order (session_tables' columns)
COLUMNS = ("k", "v", "index_keys", "k_scale", "v_scale", "index_scale")
# kv8.quantize's floor of a scale (a row of zeros stores zeros), and fp32(1 / 448)
FLOOR = tl.constexpr(kv8.SCALE_FLOOR)
INV_MAX = tl.constexpr(1.0 / kv8.FP8_MAX)


@triton.jit
def _put_row8(
    src_ptr, dst_ptr, scale_ptr, tab_ptr, pos_ptr, i, G, D, S,
    COL: tl.constexpr, SCOL: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Row i of src (G groups of D values, rows S apart) quantized a group at a time to
    session i's buffer (table column COL) at row pos[i], its G scales to column SCOL's."""
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    m = (g < G)[:, None] & (d < D)[None, :]
    x = tl.load(src_ptr + i * S + g[:, None] * D + d[None, :], mask=m, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    scale = tl.maximum(amax * INV_MAX, FLOOR)  # torch's amax / 448 on a GPU (docstring)
    q = tl.math.div_rn(x, tl.broadcast_to(scale[:, None], x.shape))
    q = tl.minimum(tl.maximum(q, -448.0), 448.0)
    tab = tab_ptr + i * TABLE_WIDTH
    at = tl.load(pos_ptr + i)
    dst = dst_ptr + at * G * D + tl.load(tab + COL)
    tl.store(dst + g[:, None] * D + d[None, :], q.to(dst_ptr.dtype.element_ty), mask=m)
    tl.store(scale_ptr + at * G + tl.load(tab + SCOL) + g, scale, mask=g < G)


@triton.jit
def _put_three8_kernel(
    s0, d0, c0, s1, d1, c1, s2, d2, c2, tab_ptr, pos_ptr,
    G0, G1, G2, D0, D1, D2, S0, S1, S2,
    C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr,
    SC0: tl.constexpr, SC1: tl.constexpr, SC2: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = 0,
):  # fmt: skip
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    i = tl.program_id(0)
    which = tl.program_id(1)
    if which == 0:
        _put_row8(s0, d0, c0, tab_ptr, pos_ptr, i, G0, D0, S0, C0, SC0, BLOCK_G, BLOCK_D)
    elif which == 1:
        _put_row8(s1, d1, c1, tab_ptr, pos_ptr, i, G1, D1, S1, C1, SC1, BLOCK_G, BLOCK_D)
    else:
        _put_row8(s2, d2, c2, tab_ptr, pos_ptr, i, G2, D2, S2, C2, SC2, BLOCK_G, BLOCK_D)


def put_quantized(first, table: torch.Tensor, pos: torch.Tensor, k, v, raw) -> None:
    """k, v [N, Hkv, D] and raw [N, Di] of N rows quantized (kv8.quantize: a scale a head's
    row, a raw key's) into session i's 8-bit cache at row pos[i] (first: the first session's
    AttnCache, whose buffers the table's offsets start from), in one launch."""
    dsts = [getattr(first, c) for c in COLUMNS]
    srcs = [k.reshape(k.shape[0], -1, k.shape[-1]), v.reshape(v.shape[0], -1, v.shape[-1])]
    srcs.append(raw.reshape(raw.shape[0], 1, raw.shape[-1]))
    if triton.knobs.runtime.interpret:  # the interpreter's e4m3 cast is wrong: torch's
        _put_in_torch(dsts, table, pos, srcs)
    else:
        store(dsts, table, pos, srcs)


def store(dsts: list, table: torch.Tensor, pos: torch.Tensor, srcs: list) -> None:
    """put_quantized's launch: srcs [N, G, D] (k, v, raw) into dsts (the first session's k, v,
    index_keys, then their scales). Value buffers of another dtype than e4m3 get the clamped
    quotients as they are (the tests' view of the arithmetic before the cast)."""
    srcs = [
        s if s.stride(-1) == 1 and s.stride(-2) == s.shape[-1] else s.contiguous() for s in srcs
    ]
    col = [TABLE_COLUMNS.index(c) for c in COLUMNS]
    groups = [s.shape[1] for s in srcs]
    widths = [s.shape[2] for s in srcs]
    _put_three8_kernel[(srcs[0].shape[0], 3)](
        srcs[0], dsts[0], dsts[3], srcs[1], dsts[1], dsts[4], srcs[2], dsts[2], dsts[5],
        table, pos, *groups, *widths, *(s.stride(0) for s in srcs),
        C0=col[0], C1=col[1], C2=col[2], SC0=col[3], SC1=col[4], SC2=col[5],
        BLOCK_G=triton.next_power_of_2(max(groups)), BLOCK_D=triton.next_power_of_2(max(widths)),
        **pdl(table.device),
    )  # fmt: skip


def _put_in_torch(dsts: list, table: torch.Tensor, pos: torch.Tensor, srcs: list) -> None:
    """put_quantized through kv8.quantize and the copying kernel (the interpreter's path)."""
    from flashlane.kernels.attention.triton_blocks import put_rows_three

    pairs = [kv8.quantize(s) for s in srcs]
    put_rows_three(dsts[:3], list(COLUMNS[:3]), table, pos, [q for q, _ in pairs])
    put_rows_three(dsts[3:], list(COLUMNS[3:]), table, pos, [s for _, s in pairs])
