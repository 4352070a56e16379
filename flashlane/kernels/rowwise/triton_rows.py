"""A lone step's own small launches (`reference.embed_rows`, `record_row`, `step_angles`):
torch's embedding gather and repeat, its index_copy_ and add, and the rows' lengths were
launches without PDL (kernels/pdl.py), each a wait for the kernel before to end (5 and 4.9 us
of a step on the H200 timeline at 8a5229a); the rotary angles of the rows and of their
blocks were two launches. The copies copy, and the angles are `triton.cos_sin`'s arithmetic:
the same bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.norms.triton import _warps as norm_warps
from flashlane.kernels.norms.triton import rms_factor
from flashlane.kernels.partials import counters, last_to_arrive
from flashlane.kernels.pdl import enter, pdl
from flashlane.kernels.rowwise import reference_step as step_ref
from flashlane.kernels.rowwise.triton_rope import angles

__all__ = ["embed_rows", "post_ring", "posts_to_pinned", "record_row", "step_angles"]

BLOCK = 2048


@triton.jit(do_not_specialize=["h", "width"])
def _embed_rows_kernel(
    w_ptr, tok_ptr, out_ptr, h, width, BLOCK: tl.constexpr, PDL: tl.constexpr = 0
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    t = tl.load(tok_ptr + row)
    tl.store(out_ptr + row * width + cols, tl.load(w_ptr + t * h + cols % h, mask=mask), mask=mask)


@triton.jit(do_not_specialize=["stride_tok"])
def _embed_norm_kernel(
    w_ptr,
    tok_ptr,
    nw_ptr,
    out_ptr,
    xn_ptr,
    eps,
    stride_tok,
    H: tl.constexpr,
    COPIES: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    # program (row, copy c): the embedding row into stream c, and its grouped RMSNorm with
    # stream c's weights: `_rms_norm_kernel`'s arithmetic, block and warps (the same bits)
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    t = tl.load(tok_ptr + row * stride_tok)
    e = tl.load(w_ptr + t * H + cols, mask=mask, other=0.0)
    at = row * COPIES * H + c * H + cols
    tl.store(out_ptr + at, e, mask=mask)
    x = e.to(tl.float32)
    w = tl.load(nw_ptr + c * H + cols, mask=mask, other=0.0).to(tl.float32)
    y = (x * rms_factor(x, H, eps)) * (1.0 + w)
    tl.store(xn_ptr + at, y.to(xn_ptr.dtype.element_ty), mask=mask)


def embed_rows(weight: torch.Tensor, tok: torch.Tensor, copies: int, norm=None):
    """reference.embed_rows in one launch: row b is weight[tok[b]], `copies` times; with
    norm = (weight [copies * H], eps), (rows, their grouped RMSNorm by H) in that launch,
    tok read where it lies (a column of a drafted step's drafts: no copy launched)."""
    b, h = tok.shape[0], weight.shape[1]
    out = torch.empty((b, copies * h), dtype=weight.dtype, device=weight.device)
    if norm is not None:
        xn = torch.empty_like(out)
        if b and h and copies:
            block = triton.next_power_of_2(h)
            _embed_norm_kernel[(b, copies)](
                weight.contiguous(),
                tok,
                norm[0].contiguous(),
                out,
                xn,
                norm[1],
                tok.stride(0),
                H=h,
                COPIES=copies,
                BLOCK=block,
                num_warps=norm_warps(block),
                **pdl(weight.device),
            )
        return out, xn
    if b and h and copies:
        _embed_rows_kernel[(b, triton.cdiv(copies * h, BLOCK))](
            weight.contiguous(),
            tok.contiguous(),
            out,
            h,
            copies * h,
            BLOCK=BLOCK,
            **pdl(weight.device),
        )
    return out


@triton.jit(do_not_specialize=["width", "n_out"])
def _record_row_kernel(
    src_ptr,
    rows_ptr,
    k_ptr,
    count_ptr,
    out_ptr,
    ring_ptr,
    width,
    n_out,
    PROGRAMS: tl.constexpr,
    BLOCK: tl.constexpr,
    RING: tl.constexpr = 0,
    OUT_BLOCK: tl.constexpr = 16,
    PDL: tl.constexpr = 0,
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    b = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    k = tl.load(k_ptr)
    per = tl.num_programs(0).to(tl.int64) * width  # values a recorded step
    tl.store(
        rows_ptr + k * per + b * width + cols,
        tl.load(src_ptr + b * width + cols, mask=mask),
        mask=mask,
    )
    # the last program to get here (every program has read k) moves k on, and with a RING
    # posts the step's verdict into slot k (post_ring's, for the k it leaves)
    if last_to_arrive(count_ptr, PROGRAMS):
        tl.store(k_ptr, k + 1)
        if RING:
            at = tl.arange(0, OUT_BLOCK)
            tl.store(
                ring_ptr + (k % RING) * n_out + at,
                tl.load(out_ptr + at, mask=at < n_out),
                mask=at < n_out,
            )


def record_row(
    rows: torch.Tensor,
    k: torch.Tensor,
    r: torch.Tensor,
    out: torch.Tensor | None = None,
    ring: torch.Tensor | None = None,
) -> None:
    """reference.record_row in one launch: rows[k] = r, then k += 1, and with out and ring
    post_ring(out, ring, k) in that launch. The torch ops where the partials' counters are
    not made yet (a capture before any split product)."""
    b, width = r.shape
    grid = (b, triton.cdiv(width, BLOCK))
    count = counters(r.device, 1)
    if (
        count is None
        or grid[0] * grid[1] == 0
        or not r.is_contiguous()
        or rows.shape[1:] != r.shape
        or not rows.is_contiguous()
    ):
        step_ref.record_row(rows, k, r, out, ring)
        return
    post = (
        dict(RING=ring.shape[0], OUT_BLOCK=triton.next_power_of_2(max(out.numel(), 16)))
        if ring is not None
        else {}
    )
    _record_row_kernel[grid](
        r,
        rows,
        k,
        count,
        r if out is None else out.contiguous(),
        r if ring is None else ring,
        width,
        0 if out is None else out.numel(),
        PROGRAMS=grid[0] * grid[1],
        BLOCK=BLOCK,
        **post,
        **pdl(r.device),
    )


@triton.jit(do_not_specialize=["n", "first"])  # one variant for one stream and many
def _step_angles_kernel(
    pos_ptr,
    inv_ptr,
    cos_ptr,
    sin_ptr,
    len_ptr,
    win_ptr,
    n,
    first,
    R: tl.constexpr,
    RP2: tl.constexpr,
    BLOCK: tl.constexpr,
    T: tl.constexpr = 0,
    PDL: tl.constexpr = 0,
):
    # T: a drafted step's rows, T a window: row b*T + j at pos[b] + first + j, stored into win
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    row = tl.program_id(0).to(tl.int64)
    blocks = tl.program_id(1)  # 0: the rows' positions; 1: their blocks' first positions
    if T:
        pos = tl.load(pos_ptr + row // T) + first + row % T
    else:
        pos = tl.load(pos_ptr + row)
    if blocks == 1:
        pos = (pos // BLOCK) * BLOCK  # positions are never negative: floor
    else:
        tl.store(len_ptr + row, pos + 1)
        if T:
            tl.store(win_ptr + row, pos)
    at = (blocks * n + row) * R
    angles(pos, inv_ptr, cos_ptr + at, sin_ptr + at, R, RP2)


def step_angles(
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    dtype: torch.dtype,
    block: int,
    window: torch.Tensor | None = None,
    first: int = 0,
):
    """reference_step.step_angles in one launch (window: [B*T] out, contiguous, of
    positions' dtype; positions [B] the windows' first, less `first`)."""
    t = 0 if window is None else window.numel() // max(1, positions.numel())
    if window is not None and (
        t * positions.numel() != window.numel() or window.dtype != positions.dtype
    ):
        raise ValueError("step_angles: window is [B*T] of the positions' dtype")
    if window is not None and not window.is_contiguous():
        raise ValueError("step_angles: window must be contiguous")
    n, r = (positions.shape[0] if window is None else window.numel()), 2 * inv_freq.shape[0]
    cos = torch.empty((2, n, r), dtype=dtype, device=positions.device)
    sin = torch.empty_like(cos)
    lengths = torch.empty(n, dtype=positions.dtype, device=positions.device)
    if n:
        _step_angles_kernel[(n, 2)](
            positions.contiguous(),
            inv_freq,
            cos,
            sin,
            lengths,
            lengths if window is None else window,
            n,
            first,
            R=r,
            RP2=triton.next_power_of_2(r),
            BLOCK=block,
            T=t,
            **pdl(cos.device),
        )
    return cos[0], sin[0], cos[1], sin[1], lengths


@triton.jit
def _post_ring_kernel(
    out_ptr, ring_ptr, k_ptr, n, RING: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = 0
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    slot = (tl.load(k_ptr) - 1) % RING
    tl.store(ring_ptr + slot * n + cols, tl.load(out_ptr + cols, mask=mask), mask=mask)


def post_ring(out: torch.Tensor, ring: torch.Tensor, k: torch.Tensor) -> None:
    """reference.post_ring in one launch that stores straight into the pinned ring (host
    memory the GPU writes: `posts_to_pinned` says whether it can), so a step's verdict needs
    no copy launched after its graph."""
    n = out.numel()
    _post_ring_kernel[(1,)](
        out.contiguous(),
        ring,
        k,
        n,
        RING=ring.shape[0],
        BLOCK=triton.next_power_of_2(max(n, 16)),
        **pdl(out.device),
    )


def posts_to_pinned(device: torch.device) -> bool:
    """Whether `post_ring` can store into pinned host memory on this device: one launch on a
    small ring, checked on the host after a sync (any error: no)."""
    try:
        ring = torch.zeros(4, 1, 2, dtype=torch.long, pin_memory=True)
        out = torch.tensor([[7, 1]], device=device)
        post_ring(out, ring, torch.tensor([3], device=device))
        torch.cuda.synchronize(device)
        return ring[2].tolist() == [[7, 1]] and not ring[[0, 1, 3]].any()
    except Exception:  # a launcher that refuses host pointers, a driver without UVA
        return False
