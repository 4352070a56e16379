"""Activations in block FP8 for the prompt rows' products (kernels/row_kind.py): each row's
K values in groups of 128, one float32 scale a group, as the weights' blocks
(models/fp8.py) and as transformers' fine-grained FP8 linear quantizes a token's
activations for these checkpoints:

    scale = amax(|x[group]|) / 448      (1 for a group of zeros)
    q     = e4m3(clamp(x / scale, -448, 448))   (round to nearest even)

A row's groups depend on that row alone, so its codes and scales do too. `act_quant` is the
Triton kernel (the GPU's cvt to e4m3, round to nearest even); `act_quant_ref` torch's, which
the interpreter runs instead (its fp32 -> e4m3 cast is wrong: -125.5 gives -64, not -128)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.linear.fp8 import BLOCK
from flashlane.kernels.pdl import enter, pdl

__all__ = ["act_quant", "act_quant_ref"]

E4M3_MAX = 448.0


# rows a program quantizes (one group of BLOCK columns each): one row a program (128 values
# on one warp) took 334 us for the MoE's 55,296 x 640 at a 2k prefill on the H100, ~0.3 TB/s
# (timeline_prefill_2048_flashnext-12l_fp8_h100_d68acca_*); a row's values and ops are the same
ROWS = 16


@triton.jit
def e4m3_groups(x):
    """x [R, BLOCK] fp32, a group of each of R rows -> (the codes' values, clamped, to cast to
    e4m3; the rows' scales [R]): the arithmetic above (also the FP8 experts' gate/up store's,
    kernels/moe/triton_pairs.store_act)."""
    amax = tl.max(tl.abs(x), axis=1)
    scale = tl.where(amax > 0.0, amax / 448.0, 1.0)
    q = tl.math.div_rn(x, scale[:, None])  # IEEE division
    return tl.minimum(tl.maximum(q, -448.0), 448.0), scale


@triton.jit(do_not_specialize=["M", "stride_x"])
def _act_quant_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    M,
    K,
    KS,
    stride_x,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    kb = tl.program_id(1)
    cols = kb * BLOCK + tl.arange(0, BLOCK)
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    q, scale = e4m3_groups(x.to(tl.float32))
    tl.store(q_ptr + rows[:, None] * K + cols[None, :], q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + rows * KS + kb, scale, mask=rows < M)


def act_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (any float dtype, rows of unit stride) -> (e4m3 codes [M, K], float32 scales
    [M, ceil(K / 128)]), in one launch."""
    m, k = x.shape
    ks = triton.cdiv(k, BLOCK)
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((m, ks), dtype=torch.float32, device=x.device)
    if m and k:
        _act_quant_kernel[(triton.cdiv(m, ROWS), ks)](
            x, q, s, m, k, ks, x.stride(0), ROWS=ROWS, BLOCK=BLOCK, num_warps=4,
            **pdl(x.device),
        )  # fmt: skip
    return q, s


def act_quant_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """act_quant in torch (float32 arithmetic, the same roundings)."""
    m, k = x.shape
    ks = -(-k // BLOCK)
    pad = torch.zeros((m, ks * BLOCK), dtype=torch.float32, device=x.device)
    pad[:, :k] = x.float()
    groups = pad.view(m, ks, BLOCK)
    amax = groups.abs().amax(dim=2)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    q = (groups / scale[:, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.view(m, ks * BLOCK)[:, :k].contiguous(), scale
