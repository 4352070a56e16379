"""An experiment for issue 34: the FP8 prompt rows' product with its K blocks overlapped (Gluon).

kernels/linear/triton_fp8.py's prompt rows take each K block's dot of e4m3 codes from zero and
then `acc = fma(dot, xs * s, acc)`; Triton 3.6 compiles that to `wgmma.wait_group 0` a block,
so the tensor cores idle while each block drains (LOG.md, 2026-12-07 14:31). Here the same
sums in the same order, written in Gluon: block k + 1's wgmma is issued before block k's fma,
which waits with one group left in flight (`warpgroup_mma_wait(num_outstanding=1)`), and the
tiles come in by TMA into a ring of STAGES buffers. Each tile sums every partition of its K
blocks ((p0 + p1) + ...), as triton_fp8's in-program path; the same wgmma instruction (e4m3 x
e4m3, fp32, no promotion: both take sm_90's default), so the same bits, which this script
checks (H100, cb1f427: equal in every cell). A program runs one tile, or (PER_SM) is
persistent over tiles with its K blocks one stream through the ring, so a tile's store and
the next tile's first loads overlap its last blocks.

Not in the product: on the device it times this against `linear_fp8` at prompt rows for the
real model's products and says whether every output bit is the same.

    python benchmarks/fp8_gluon.py [--rows 8192]         # a GPU (sm_90)
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

BLOCK_K = 128  # one block of scales


@gluon.jit
def _load(x_desc, q_desc, bars, a_bufs, b_bufs, g, KB, m_tiles, tiles, STAGES: gl.constexpr):
    """The program's g-th K block (its tiles' blocks in a row: tile g // KB of the program's,
    block g % KB) into ring slot g % STAGES by TMA, arriving on the slot's bar; none past the
    program's last tile."""
    tile = gl.program_id(0) + (g // KB) * gl.num_programs(0)
    if tile < tiles:
        kb = g % KB
        slot = g % STAGES
        bar = bars.index(slot)
        off_m = (tile % m_tiles) * x_desc.block_type.shape[0]
        off_n = (tile // m_tiles) * q_desc.block_type.shape[0]
        mbarrier.expect(bar, x_desc.block_type.nbytes + q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(x_desc, [off_m, kb * 128], bar, a_bufs.index(slot))
        tma.async_copy_global_to_shared(q_desc, [off_n, kb * 128], bar, b_bufs.index(slot))


@gluon.jit
def _issue(bars, a_bufs, b_bufs, zero, g, STAGES: gl.constexpr):
    """The g-th block's dot from zero, asynchronous, once its tiles have landed."""
    slot = g % STAGES
    mbarrier.wait(bars.index(slot), phase=(g // STAGES) & 1)
    b = b_bufs.index(slot).permute((1, 0))
    return warpgroup_mma(a_bufs.index(slot), b, zero, use_acc=False, is_async=True)


@gluon.jit
def _factor(xs_ptr, s_ptr, rows, m_ok, nb, kb, KS):
    """xs[rows, kb] * scale_inv[nb, kb], rounded as triton_fp8's `xs[:, None] * s`."""
    xs = gl.load(xs_ptr + rows.to(gl.int64) * KS + kb, mask=m_ok, other=0.0)
    return xs * gl.load(s_ptr + nb.to(gl.int64) * KS + kb)


@gluon.jit
def _fp8_prompt_kernel(
    x_desc, q_desc, xs_ptr, s_ptr, y_ptr, M, N, KB, KS, stride_y,
    PARTS: gl.constexpr, BLOCKS_PER_PART: gl.constexpr, BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    """Tiles pid, pid + programs, ... (row tiles fastest: the programs at work share weight
    columns), each as triton_fp8's in-program path sums it. The program's K blocks are one
    stream through the ring, so the next tile's first blocks load during this tile's last
    ones and its store. A grid of every tile is one tile a program."""
    m_tiles = gl.cdiv(M, BLOCK_M)
    tiles = m_tiles * gl.cdiv(N, BLOCK_N)
    mma: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 32]
    )
    a_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_M, 128], x_desc.layout)
    b_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_N, 128], q_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    fence_async_shared()  # the barriers' init seen by the TMA unit before it arrives on them
    for i in gl.static_range(STAGES - 1):
        _load(x_desc, q_desc, bars, a_bufs, b_bufs, i, KB, m_tiles, tiles, STAGES)
    zero = gl.zeros((BLOCK_M, BLOCK_N), gl.float32, layout=mma)
    g0 = 0  # the program's blocks before this tile
    for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
        off_m = (tile % m_tiles) * BLOCK_M
        off_n = (tile // m_tiles) * BLOCK_N
        rows = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma))
        cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
        m_ok = rows < M
        nb = off_n // 128
        total = zero
        for part in gl.static_range(PARTS):
            start = part * BLOCKS_PER_PART
            end = gl.minimum(start + BLOCKS_PER_PART, KB)
            acc = zero
            if start < end:
                # the slot of the block before is free (its partition drained, or none)
                _load(x_desc, q_desc, bars, a_bufs, b_bufs, g0 + start + STAGES - 1, KB,
                      m_tiles, tiles, STAGES)  # fmt: skip
                prev = _issue(bars, a_bufs, b_bufs, zero, g0 + start, STAGES)
                f_prev = _factor(xs_ptr, s_ptr, rows, m_ok, nb, start, KS)
                for kb in range(start + 1, end):
                    cur = _issue(bars, a_bufs, b_bufs, zero, g0 + kb, STAGES)
                    f_cur = _factor(xs_ptr, s_ptr, rows, m_ok, nb, kb, KS)
                    # block kb - 1's sums, with block kb's still in flight
                    done = warpgroup_mma_wait(num_outstanding=1, deps=(prev,))
                    acc = gl.fma(done, gl.expand_dims(f_prev, 1), acc)
                    # block kb - 1's slot is free: the block STAGES - 1 ahead into it
                    _load(x_desc, q_desc, bars, a_bufs, b_bufs, g0 + kb + STAGES - 1, KB,
                          m_tiles, tiles, STAGES)  # fmt: skip
                    prev, f_prev = cur, f_cur
                done = warpgroup_mma_wait(num_outstanding=0, deps=(prev,))
                acc = gl.fma(done, gl.expand_dims(f_prev, 1), acc)
            if part == 0:
                total = acc
            else:
                total = total + acc
        out = gl.expand_dims(rows.to(gl.int64), 1) * stride_y + gl.expand_dims(cols, 0)
        ok = gl.expand_dims(m_ok, 1) & gl.expand_dims(cols < N, 0)
        gl.store(y_ptr + out, total.to(y_ptr.dtype.element_ty), mask=ok)
        g0 += KB
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))


def descriptors(x8: torch.Tensor, q: torch.Tensor, block_m: int, block_n: int) -> tuple:
    """TMA descriptors of the e4m3 activations [M, K] and weights [N, K] in 128-deep tiles."""
    lay_x = gl.NVMMASharedLayout.get_default_for([block_m, BLOCK_K], gl.float8e4nv)
    lay_q = gl.NVMMASharedLayout.get_default_for([block_n, BLOCK_K], gl.float8e4nv)
    return (
        TensorDescriptor.from_tensor(x8, [block_m, BLOCK_K], lay_x),
        TensorDescriptor.from_tensor(q, [block_n, BLOCK_K], lay_q),
    )


def prompt_linear(x8, xs, w, parts: int, blocks_per_part: int, tile: dict) -> torch.Tensor:
    """y [M, N] bf16 = the prompt rows' product of act_quant's (x8, xs) and Fp8Weight w, with
    the K blocks in `parts` partitions of `blocks_per_part` (fp8_parts' split)."""
    m, k = x8.shape
    n = w.q.shape[0]
    bm, bn = tile["BLOCK_M"], tile["BLOCK_N"]
    y = torch.empty((m, n), dtype=torch.bfloat16, device=x8.device)
    x_desc, q_desc = descriptors(x8, w.q.contiguous(), bm, bn)
    s = w.scale_inv.contiguous()
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    if tile.get("PER_SM"):  # persistent: that many programs a multiprocessor
        sms = torch.cuda.get_device_properties(x8.device).multi_processor_count
        tiles = min(tiles, tile["PER_SM"] * sms)
    _fp8_prompt_kernel[(tiles,)](
        x_desc, q_desc, xs, s, y, m, n, triton.cdiv(k, BLOCK_K), s.shape[1], y.stride(0),
        PARTS=parts, BLOCKS_PER_PART=blocks_per_part, BLOCK_M=bm, BLOCK_N=bn,
        STAGES=tile["STAGES"], num_warps=tile["num_warps"],
    )  # fmt: skip
    return y


TILES = [  # PER_SM: persistent programs a multiprocessor (else one program a tile)
    dict(BLOCK_M=128, BLOCK_N=128, STAGES=4, num_warps=8),
    dict(BLOCK_M=128, BLOCK_N=128, STAGES=4, num_warps=8, PER_SM=1),
    dict(BLOCK_M=64, BLOCK_N=64, STAGES=6, num_warps=4),
    dict(BLOCK_M=64, BLOCK_N=64, STAGES=6, num_warps=4, PER_SM=2),
    dict(BLOCK_M=128, BLOCK_N=64, STAGES=4, num_warps=8, PER_SM=1),
]


def main() -> None:
    from benchmarks.tune_fp8_decode import LINEARS, random_fp8
    from flashlane.bench.common import cuda_timed
    from flashlane.kernels.linear import triton_fp8
    from flashlane.kernels.linear.act_quant import act_quant

    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    out = []
    for n, k in LINEARS.values():  # Flash Next's FP8 linears (N, K)
        w = random_fp8((n, k), "cuda", g)
        x = torch.randn(args.rows, k, generator=g, device="cuda").to(torch.bfloat16)
        x8, xs = act_quant(x)
        tile = triton_fp8.fp8_tile(args.rows, n, k, True)
        parts, bpp = tile["PARTS"], tile["BLOCKS_PER_PART"]
        want = triton_fp8.linear_fp8(x, w, tile)  # prompt rows' tile: act_quant, then wgmma

        def base(w=w, x=x, tile=tile):
            return triton_fp8.linear_fp8(x, w, tile)

        base_ms = cuda_timed(base, 10) * 1e3
        quant_ms = cuda_timed(lambda x=x: act_quant(x), 10) * 1e3  # in base_ms, not below
        flops = 2.0 * args.rows * n * k
        row = dict(n=n, k=k, parts=parts, default_ms=base_ms, act_quant_ms=quant_ms,
                   default_tf=flops / (base_ms - quant_ms) / 1e9)  # fmt: skip
        print(f"{n} x {k} ({parts} parts): default {base_ms:.3f} ms with act_quant's "
              f"{quant_ms:.3f}; its product {row['default_tf']:.0f} TF/s")  # fmt: skip
        for t in TILES:
            name = f"{t['BLOCK_M']}x{t['BLOCK_N']} s{t['STAGES']} w{t['num_warps']}"
            name += f" persistent {t['PER_SM']}/SM" if t.get("PER_SM") else ""
            try:
                got = prompt_linear(x8, xs, w, parts, bpp, t)
                same = torch.equal(got.view(torch.int16), want.view(torch.int16))
                diff = (got.float() - want.float()).abs().max().item()

                def run(t=t, w=w, x8=x8, xs=xs, parts=parts, bpp=bpp):
                    return prompt_linear(x8, xs, w, parts, bpp, t)

                ms = cuda_timed(run, 10) * 1e3
                cell = dict(tile=name, ms=ms, tf=flops / ms / 1e9, same_bits=same, max_diff=diff)
                print(f"  gluon {name}: {ms:.3f} ms, {cell['tf']:.0f} TF/s, bits "
                      f"{'same' if same else f'OTHER (max diff {diff:.3g})'}")  # fmt: skip
            except Exception as e:  # a tile that does not compile or fit: say so, go on
                cell = dict(tile=name, error=f"{type(e).__name__}: {str(e)[:160]}")
                print(f"  gluon {name}: {cell['error']}")
            row.setdefault("gluon", []).append(cell)
        out.append(row)
    text = json.dumps(dict(bench="fp8_gluon", rows=args.rows, shapes=out))
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
