"""Row-invariant block-FP8 GEMM: `linear(x, w)` for an Fp8Weight w, x @ (q * scale_inv).T.

The weight is read as its e4m3 bytes (half bf16's). Decode rows: converted exactly to x's
dtype in registers (e4m3's 3 significant bits and exponents fit bf16's; to bf16 by bits,
`bf16_of_e4m3`), and each K block of 128 (one block of scales) is a dot from zero in fp32
which is then scaled and added, `acc = fma(dot_kb, scale[n // 128, kb], acc)`: the scales
apply to fp32 sums, never to the bf16 operands, and the fma rounds once wherever it is
compiled. Prompt rows (kernels/row_kind.py): their activations in block FP8 too (1 x 128
groups, kernels/linear/act_quant.py, as transformers' fine-grained FP8 linear), each K
block's dot of e4m3 codes on the tensor cores, `acc = fma(dot_kb, xs[m, kb] * scale, acc)`.
The K blocks are cut into PARTS fixed partitions that depend on (N, K) and the rows' kind
only (`fp8_tiles`); each partition sums its blocks in ascending order from zero, and the
partitions are added in ascending order, `((p0 + p1) + p2) + ...` as the bf16 kernel's
(kernels/linear/triton.py), so a row's bits never depend on the call's other rows. The
tile's shape follows the rows' kind and count (decode rows: 16 rows up to DECODE_ROWS, 32
above, both on mma.sync; prompt rows: 64 on wgmma), never the partitions; with few tiles
each partition is its own program and the tile's last program adds the fp32 partials in
order (kernels/partials.py), else one program runs them all: the same sums and bits.

fp32 inputs (the tests under the interpreter) take exact fp32 products (`ieee`): bitwise
`x @ dequantize(w, fp32).T` summed in this order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels import row_kind
from flashlane.kernels.linear import triton as dense_tr
from flashlane.kernels.linear.act_quant import act_quant, act_quant_ref
from flashlane.kernels.linear.fp8 import BLOCK, Fp8Weight
from flashlane.kernels.linear.fp8_tiles import fp8_parts, fp8_tile  # noqa: F401 (re-exported)
from flashlane.kernels.partials import NUM_COUNTERS, add_partials, counters, last_to_arrive
from flashlane.kernels.pdl import enter, pdl

# row tiles x column tiles from which one program runs every partition
_IN_PROGRAM_TILES = 128
BITS = True  # e4m3 to bf16 by bits (`bf16_of_e4m3`) for bf16 x on a GPU; False: Triton's
# split partitions added by each tile's last program; False: by a second kernel (the path
# taken while a CUDA graph is captured before the counters exist; the tests take both)
_FIXUP = True


@triton.jit
def bf16_of_e4m3(b):
    """The e4m3 values b as bf16, exactly, four at a time in the integer and bf16x2 units.
    Triton's own conversion goes e4m3x2 -> f16x2 -> one F2F a value (the SASS: 64 F2F a K
    block a thread), and conversions run at 16 a clock per SM (NVIDIA's throughput table):
    by that estimate a bound near 2.4 TB/s at one row, where the H200 measured 1.0-2.2.
    Here each byte goes to the top of a 16-bit half (prmt), its sign kept and its exponent
    and mantissa moved down by 4: the bf16 of value * 2^-120 (exponent fields line up:
    e4m3's bias 7, bf16's 127; its subnormals land on bf16's subnormals, the same ratio),
    then one bf16x2 multiply by 2^120, exact. The NaN
    codes (0x7F, 0xFF: no checkpoint holds them) come out as +-480."""
    return tl.inline_asm_elementwise(
        """{
        .reg .b32 lo, hi, t, up;
        prmt.b32 lo, $2, 0, 0x1404;
        prmt.b32 hi, $2, 0, 0x3424;
        mov.b32 up, 0x7B807B80;
        shr.b32 t, lo, 4;
        and.b32 t, t, 0x07F007F0;
        and.b32 lo, lo, 0x80008000;
        or.b32 lo, lo, t;
        mul.rn.bf16x2 $0, lo, up;
        shr.b32 t, hi, 4;
        and.b32 t, t, 0x07F007F0;
        and.b32 hi, hi, 0x80008000;
        or.b32 hi, hi, t;
        mul.rn.bf16x2 $1, hi, up;
        }""",
        "=r,=r,r",
        [b.to(tl.uint8, bitcast=True)],
        dtype=tl.bfloat16,
        is_pure=True,
        pack=4,
    )


@triton.jit
def weight_operand(b, a, BY_BITS: tl.constexpr):
    """The e4m3 tile b in a's dtype for the dot: by bits (bf16_of_e4m3) or by Triton."""
    if BY_BITS:
        out = bf16_of_e4m3(b)
    else:
        out = b.to(a.dtype)
    return out


@triton.jit
def block_scales(s_ptr, nb, kb0, count, KS, SCALES: tl.constexpr):
    """scale_inv[nb, kb0 .. kb0 + count - 1] (zeros past count): a tile's columns lie in one
    row of 128-column blocks (BLOCK_N divides 128), so its scales are one short vector,
    loaded once before the K loop. Loaded a block at a time inside the loop (a plain load,
    not one of the pipelined copies), each load's latency stood between the block's dot and
    its fma."""
    j = tl.arange(0, SCALES)
    return tl.load(s_ptr + nb.to(tl.int64) * KS + kb0 + j, mask=j < count, other=0.0)


@triton.jit
def pick(scales, j, SCALES: tl.constexpr):
    """scales[j], exactly (one value and zeros summed)."""
    return tl.sum(tl.where(tl.arange(0, SCALES) == j, scales, 0.0), axis=0)


@triton.jit
def _scaled_sum(
    x_ptr, q_ptr, s, xs, rm, rn, m_mask, n_mask, kb, acc, K, stride_x,
    BLOCK_K: tl.constexpr, IEEE: tl.constexpr, BY_BITS: tl.constexpr, X_FP8: tl.constexpr,
):  # fmt: skip
    """acc + (x[rm, kb's K] . q[rn, kb's K]) * s (the tile's scale_inv of block kb), one fma
    rounding (`scaled_dot`; X_FP8: x is e4m3 codes, xs their rows' scales of block kb)."""
    rk = kb * BLOCK_K + tl.arange(0, BLOCK_K)
    k_mask = rk < K
    a = tl.load(
        x_ptr + rm[:, None].to(tl.int64) * stride_x + rk[None, :],
        mask=m_mask[:, None] & k_mask[None, :],
        other=0.0,
    )
    b = tl.load(
        q_ptr + rn[None, :].to(tl.int64) * K + rk[:, None],
        mask=n_mask[None, :] & k_mask[:, None],
        other=0.0,
    )
    return scaled_dot(a, b, s, xs, acc, IEEE, BY_BITS, X_FP8)


@triton.jit
def scaled_dot(a, b, s, xs, acc, IEEE: tl.constexpr, BY_BITS: tl.constexpr, X_FP8: tl.constexpr):
    """acc + (a . b) * s, one fma: b an e4m3 weight tile of one K block, s its block scale; a
    in x's dtype (b converted to it), or with X_FP8 e4m3 codes (act_quant) whose rows'
    scales of the block are xs [BLOCK_M]: the dot of codes on e4m3 tensor cores, one fma by
    xs * s. IEEE: exact fp32 products (the interpreter's tests)."""
    if X_FP8:
        if IEEE:
            p = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        else:
            p = tl.dot(a, b)
        out = tl.fma(p, xs[:, None] * s, acc)
    else:
        if IEEE:
            p = tl.dot(a, b.to(tl.float32), input_precision="ieee")
        else:
            p = tl.dot(a, weight_operand(b, a, BY_BITS))
        out = tl.fma(p, s, acc)
    return out


@triton.jit
def row_scales(xs_ptr, rows, valid, KS, start, count, X_FP8: tl.constexpr, SCALES: tl.constexpr):
    """X_FP8: the rows' activation scales of K blocks start.. [BLOCK_M, SCALES] (zeros past
    count), loaded before the K loop as `block_scales`; else zeros (unread)."""
    j = tl.arange(0, SCALES)
    if X_FP8:
        at = valid[:, None] & (j[None, :] < count)
        out = tl.load(
            xs_ptr + rows[:, None].to(tl.int64) * KS + start + j[None, :], mask=at, other=0.0
        )
    else:
        out = tl.zeros((rows.shape[0], SCALES), dtype=tl.float32)
    return out


@triton.jit
def column(scales, j, SCALES: tl.constexpr):
    """scales[:, j], exactly (one value and zeros summed a row): `pick` of each row."""
    return tl.sum(tl.where(tl.arange(0, SCALES)[None, :] == j, scales, 0.0), axis=1)


@triton.jit
def _partition(
    x_ptr, xs_ptr, q_ptr, s_ptr, rm, rn, m_mask, n_mask, part, K, KS, stride_x,
    BLOCKS_PER_PART: tl.constexpr, SCALES: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr, BY_BITS: tl.constexpr,
    X_FP8: tl.constexpr,
):  # fmt: skip
    """Partition `part`'s K blocks, ascending, from zero, in fp32."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    start = part * BLOCKS_PER_PART
    end = tl.minimum(start + BLOCKS_PER_PART, tl.cdiv(K, BLOCK_K))
    nb = tl.program_id(1) * BLOCK_N // BLOCK_K
    scales = block_scales(s_ptr, nb, start, end - start, KS, SCALES)
    xscales = row_scales(xs_ptr, rm, m_mask, KS, start, end - start, X_FP8, SCALES)
    for kb in range(start, end):
        s = pick(scales, kb - start, SCALES)
        xs = column(xscales, kb - start, SCALES)
        acc = _scaled_sum(
            x_ptr, q_ptr, s, xs, rm, rn, m_mask, n_mask, kb, acc, K, stride_x, BLOCK_K, IEEE,
            BY_BITS, X_FP8,
        )  # fmt: skip
    return acc


@triton.jit(do_not_specialize=["M", "prefetch"])
def _fp8_linear_kernel(
    x_ptr, xs_ptr, q_ptr, s_ptr, y_ptr, ws_ptr, count_ptr, M, N, K, KS, stride_x, stride_y,
    prefetch, PARTS: tl.constexpr, BLOCKS_PER_PART: tl.constexpr, SCALES: tl.constexpr,
    SPLIT: tl.constexpr, FIXUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, IEEE: tl.constexpr, BY_BITS: tl.constexpr = False,
    X_FP8: tl.constexpr = False, PDL: tl.constexpr = 0,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # a constexpr and a runtime test in one `and` would not fold the constexpr away
    if PDL:  # noqa: SIM102 (the e4m3 weights nothing writes, into L2 while the kernel before runs)
        if prefetch > 0:
            k0 = tl.program_id(2) * BLOCKS_PER_PART * BLOCK_K if SPLIT else 0
            dense_tr.prefetch_rows(q_ptr, rn, N, K, k0, prefetch, 1)
    enter(PDL)  # kernels/pdl.py: then nothing is read or written before the kernel before ends
    m_mask = rm < M
    n_mask = rn < N
    out_mask = m_mask[:, None] & n_mask[None, :]
    offs_y = rm[:, None].to(tl.int64) * stride_y + rn[None, :]
    dt: tl.constexpr = y_ptr.dtype.element_ty
    if SPLIT:
        part = tl.program_id(2)
        acc = _partition(
            x_ptr, xs_ptr, q_ptr, s_ptr, rm, rn, m_mask, n_mask, part, K, KS, stride_x,
            BLOCKS_PER_PART, SCALES, BLOCK_M, BLOCK_N, BLOCK_K, IEEE, BY_BITS, X_FP8,
        )  # fmt: skip
        plane = M.to(tl.int64) * N
        offs = rm[:, None].to(tl.int64) * N + rn[None, :]
        tl.store(ws_ptr + part * plane + offs, acc, mask=out_mask)
        # a constexpr and a runtime test in one `and` would not fold the constexpr away
        if FIXUP:  # noqa: SIM102
            if last_to_arrive(count_ptr + pid_m * tl.num_programs(1) + pid_n, PARTS):
                total = add_partials(ws_ptr, offs, out_mask, plane, PARTS, ".cg")
                tl.store(y_ptr + offs_y, total.to(dt), mask=out_mask)
    else:
        total = _partition(
            x_ptr, xs_ptr, q_ptr, s_ptr, rm, rn, m_mask, n_mask, 0, K, KS, stride_x,
            BLOCKS_PER_PART, SCALES, BLOCK_M, BLOCK_N, BLOCK_K, IEEE, BY_BITS, X_FP8,
        )  # fmt: skip
        for p in range(1, PARTS):
            acc = _partition(
                x_ptr, xs_ptr, q_ptr, s_ptr, rm, rn, m_mask, n_mask, p, K, KS, stride_x,
                BLOCKS_PER_PART, SCALES, BLOCK_M, BLOCK_N, BLOCK_K, IEEE, BY_BITS, X_FP8,
            )  # fmt: skip
            total = total + acc
        tl.store(y_ptr + offs_y, total.to(dt), mask=out_mask)


def by_bits(x: torch.Tensor) -> bool:
    """Whether the kernels convert e4m3 by bits for x: bf16 on a GPU (the interpreter has no
    inline PTX; fp16 and fp32 take Triton's conversion)."""
    interpreted = triton.knobs.runtime.interpret  # TRITON_INTERPRET=1, as Triton reads it
    return BITS and x.is_cuda and x.dtype == torch.bfloat16 and not interpreted


def linear_fp8(x: torch.Tensor, w: Fp8Weight, tile: dict | None = None) -> torch.Tensor:
    """x @ dequantize(w).T. x: [..., K] (bf16 / fp16 / fp32); w: Fp8Weight [N, K] -> [..., N]
    in x's dtype, fp32 sums rounded once, in fp8_tile's tile for the rows' kind
    (kernels/row_kind.py: a forward's decode rows and prompt rows in a launch each). tile:
    fp8_tile's keys, to check another tile."""
    k = x.shape[-1]
    n, kw = w.shape
    if w.q.ndim != 2 or kw != k:
        raise ValueError(f"linear: x has K={k}, the FP8 weight is {tuple(w.shape)}")
    lead = x.shape[:-1]
    x2 = x if x.dim() == 2 and x.stride(-1) == 1 else x.reshape(-1, k).contiguous()
    q, s = w.q.contiguous(), w.scale_inv.contiguous()
    m = x2.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y.reshape(*lead, n)
    if k == 0:
        return y.zero_().reshape(*lead, n)
    if tile is None:
        runs = row_kind.split(m)
        if len(runs) > 1:  # the decode rows and the prompt rows, each in its tile
            for a, b, prompt in runs:
                y[a:b] = linear_fp8(x2[a:b], w, fp8_tile(b - a, n, k, prompt))
            return y.reshape(*lead, n)
        tile = fp8_tile(m, n, k, runs[0][2])
    cfg = tile
    if cfg["BLOCK_K"] != BLOCK or BLOCK % cfg["BLOCK_N"]:
        raise ValueError(
            f"linear: an FP8 tile's BLOCK_K is its scale block, {BLOCK}, and its BLOCK_N "
            f"divides it (one row of scales a tile), got {cfg['BLOCK_K']}, {cfg['BLOCK_N']}"
        )
    bm, bn, parts = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["PARTS"]
    m_tiles, n_tiles = triton.cdiv(m, bm), triton.cdiv(n, bn)
    tiles = m_tiles * n_tiles  # a tile asking SPLIT splits where the counters cover it
    split = parts > 1 and cfg.get("SPLIT", tiles < _IN_PROGRAM_TILES) and tiles <= NUM_COUNTERS
    # None while a graph is captured before the counters exist: a second kernel adds
    count = counters(x.device, tiles) if split and _FIXUP else None
    x_fp8 = cfg.get("X_FP8", False)
    xs = x2  # unread without X_FP8
    if x_fp8:  # the rows' activations in block FP8 (act_quant), e4m3 products
        x2, xs = (act_quant_ref if triton.knobs.runtime.interpret else act_quant)(x2)
    meta = dict(
        PARTS=parts,
        BLOCKS_PER_PART=cfg["BLOCKS_PER_PART"],
        SCALES=triton.next_power_of_2(cfg["BLOCKS_PER_PART"]),
        SPLIT=split,
        FIXUP=count is not None,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=cfg["BLOCK_K"],
        IEEE=x.dtype == torch.float32,
        BY_BITS=by_bits(x),
        X_FP8=x_fp8,
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )
    launch = pdl(x.device)
    meta.update(launch)
    # a decode call's weights into L2 under PDL (kernels/linear/triton.py's prefetch_span)
    ahead = dense_tr.prefetch_span(q, cfg, m, n_tiles, parts if split else 1) if launch else 0
    ks = s.shape[1]
    if not split:
        _fp8_linear_kernel[(m_tiles, n_tiles, 1)](
            x2, xs, q, s, y, y, y, m, n, k, ks, x2.stride(0), y.stride(0), ahead, **meta
        )
        return y.reshape(*lead, n)
    ws = torch.empty((parts, m, n), dtype=torch.float32, device=x.device)
    _fp8_linear_kernel[(m_tiles, n_tiles, parts)](
        x2, xs, q, s, y, ws, ws if count is None else count, m, n, k, ks, x2.stride(0),
        y.stride(0), ahead, **meta,
    )  # fmt: skip
    if count is None:
        block = 1024
        dense_tr._sum_parts_kernel[(triton.cdiv(m * n, block),)](
            ws, y, m * n, n, y.stride(0), 0, PARTS=parts, SQUASH=0, BLOCK=block, num_warps=4
        )
    return y.reshape(*lead, n)


def linear(
    x: torch.Tensor,
    w: torch.Tensor | Fp8Weight,
    out_dtype: torch.dtype | None = None,
    squash: tuple[int, int] | None = None,
    tile: dict | None = None,
    aligned: bool = False,
) -> torch.Tensor:
    """The kernels' linear on CUDA: an Fp8Weight through `linear_fp8`, a plain weight through
    the bf16 kernel (kernels/linear/triton.py, whose options it takes). x: [..., K]; w: [N, K].
    The FP8 path has none of those options (its users, the quantized linears, need none)."""
    if not isinstance(w, Fp8Weight):
        return dense_tr.linear(x, w, out_dtype, squash, tile, aligned)
    if out_dtype not in (None, x.dtype) or squash is not None or aligned:
        raise ValueError("linear: an FP8 weight takes no out_dtype, squash or aligned")
    return linear_fp8(x, w, tile)
