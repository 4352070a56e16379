"""Depthwise causal conv in one Triton launch, same signature as `reference.causal_conv`.

Program = one (BLOCK_T rows, BLOCK_C channels) tile of one sequence. It reads each tap's
inputs straight from `window` or `x` (wherever row t + j * dilation of xfull lies), writes
y for its tile and copies its x rows into xfull; the first row block copies the window.

Rounding follows the reference's torch ops in the output dtype (x's dtype promoted with the
weight's): each tap's product is rounded to it, then each running sum, then silu, all computed
in fp32. Every output element is that fixed sequence of elementwise ops, so a row's bits never
depend on B, T or the tile it falls in. FMA contraction is turned off at launch so that fp32
keeps the reference's separate product and sum roundings on the GPU too.

silu is x / (1 + exp(-x)) in fp32, as torch computes it, but exp (and on the GPU the division)
is Triton's, not torch's: fp32 results may differ from the reference's by a few ulps, and a
bf16 result may then round to the neighbouring value. Without silu fp32 results are bitwise
the reference's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.conv import reference
from flashlane.kernels.pdl import enter, pdl
from flashlane.kernels.session_tables import GDN_CONV_COLUMN, offsets_table
from flashlane.kernels.tables import TABLE_WIDTH, no_table

# rows per tile stop at 16 (prompts); channels per tile at 256: a decode step (T = 1) over
# C = 10240 channels still spreads over 40 programs per sequence
MAX_BLOCK_T = 16
MAX_BLOCK_C = 256


@triton.jit(do_not_specialize=["T", "use_table"])
def _causal_conv_kernel(
    x_ptr,
    win_ptr,
    w_ptr,
    y_ptr,
    xfull_ptr,
    tab_ptr,
    use_table,
    T,
    C,
    stride_xb,
    stride_xt,
    stride_xc,
    stride_winb,
    stride_wint,
    stride_winc,
    stride_wc,
    stride_wk,
    K: tl.constexpr,
    DIL: tl.constexpr,
    SILU: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_W: tl.constexpr,
    SHIFT: tl.constexpr = False,
    COLUMN: tl.constexpr = GDN_CONV_COLUMN,
    PDL: tl.constexpr = 0,
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    i_c, i_t, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    W: tl.constexpr = (K - 1) * DIL
    dt = y_ptr.dtype.element_ty
    x_dt = xfull_ptr.dtype.element_ty

    o_c = i_c * BLOCK_C + tl.arange(0, BLOCK_C)
    o_t = (i_t * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    mask_c = o_c < C
    mask_t = o_t < T
    p_x = x_ptr + i_b * stride_xb + o_c[None, :] * stride_xc
    # batch b's window: row b of the input, or session b's conv window where it lies
    # (the table's COLUMN, gdn_table's conv column by default: elements from the first
    # session's)
    win_b = i_b * stride_winb
    if use_table != 0:
        win_b = tl.load(tab_ptr + i_b * TABLE_WIDTH + COLUMN)
    p_win = win_ptr + win_b + o_c[None, :] * stride_winc
    # xfull and y are made contiguous: [B, W+T, C] and [B, T, C]
    p_xfull = xfull_ptr + i_b * (W + T) * C + o_c[None, :]

    # the first row block also copies the window into xfull
    o_w = tl.arange(0, BLOCK_W)
    mask_w = ((o_w < W) & (i_t == 0))[:, None] & mask_c[None, :]
    b_win = tl.load(p_win + o_w[:, None] * stride_wint, mask=mask_w, other=0.0)
    tl.store(p_xfull + o_w[:, None] * C, b_win.to(x_dt), mask=mask_w)

    for j in tl.static_range(K):
        # row t + j * DIL of xfull: a window row while it is below W, else x row (that - W)
        o_s = o_t + j * DIL
        mask_win = (mask_t & (o_s < W))[:, None] & mask_c[None, :]
        mask_x = (mask_t & (o_s >= W))[:, None] & mask_c[None, :]
        b_win = tl.load(p_win + o_s[:, None] * stride_wint, mask=mask_win, other=0.0)
        b_x = tl.load(p_x + (o_s - W)[:, None] * stride_xt, mask=mask_x, other=0.0)
        b_in = tl.where(mask_win, b_win.to(x_dt), b_x.to(x_dt))
        if j == K - 1:
            # the last tap reads exactly the tile's own x rows: they are its part of xfull
            tl.store(p_xfull + (W + o_t)[:, None] * C, b_in, mask=mask_x)
        b_w = tl.load(w_ptr + o_c * stride_wc + j * stride_wk, mask=mask_c, other=0.0)
        b_p = (b_in.to(tl.float32) * b_w.to(tl.float32)[None, :]).to(dt).to(tl.float32)
        if j == 0:
            b_y = b_p
        else:
            b_y = (b_y + b_p).to(dt).to(tl.float32)

    if SILU:
        b_y = b_y / (1.0 + tl.exp(-b_y))
    mask = mask_t[:, None] & mask_c[None, :]
    tl.store(y_ptr + i_b * T * C + o_t[:, None] * C + o_c[None, :], b_y.to(dt), mask=mask)
    if SHIFT:  # the window after the T rows, in place: its row r is xfull row T + r
        # one row block (causal_conv checks): every read of these channels' window is this
        # program's, and the barrier orders them all before the writes
        src = o_w.to(tl.int64) + T
        mask_r = (o_w < W)[:, None] & mask_c[None, :]
        from_win = (src < W)[:, None] & mask_r
        from_x = (src >= W)[:, None] & mask_r
        b_win = tl.load(p_win + src[:, None] * stride_wint, mask=from_win, other=0.0)
        b_x = tl.load(p_x + (src - W)[:, None] * stride_xt, mask=from_x, other=0.0)
        b_new = tl.where(from_win, b_win, b_x.to(win_ptr.dtype.element_ty))
        tl.debug_barrier()
        tl.store(p_win + o_w[:, None] * stride_wint, b_new, mask=mask_r)


def causal_conv(
    x: torch.Tensor,
    window: torch.Tensor,
    weight: torch.Tensor,
    dilation: int = 1,
    silu: bool = True,
    shift: bool = False,
    table: torch.Tensor | None = None,
    column: int = GDN_CONV_COLUMN,
) -> tuple[torch.Tensor, torch.Tensor]:
    """y_t = act(sum_j w[:, j] * xfull[t + j * dilation]), xfull = cat(window, x).

    x: [B, T, C] new inputs; window: [B, (k-1)*dilation, C] the inputs before them; weight:
    [C, k] (any strides: the model passes a view of its [C, 1, k] parameter). Returns
    (y [B, T, C] in x's dtype promoted with the weight's, xfull [B, W+T, C] in x's dtype).
    shift: also write the window after the T rows (xfull's last W) into `window` in place,
    in the same launch (T up to MAX_BLOCK_T: one row block reads each channel's window).
    table: window is the first of B sessions' [1, W, C] windows, batch b's at the offset
    of table row b's `column` (the GDN table's conv column: conv_sessions; the PLE's 0).
    """
    b, t, c = x.shape
    k = weight.shape[-1]
    w = (k - 1) * dilation
    if weight.shape != (c, k) or window.shape != (1 if table is not None else b, w, c):
        raise ValueError(
            f"causal_conv: x {tuple(x.shape)}, window {tuple(window.shape)}, weight "
            f"{tuple(weight.shape)} do not fit a [B, T, C] conv of {k} taps, dilation {dilation}"
        )
    out_dtype = torch.promote_types(x.dtype, weight.dtype)
    if out_dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"causal_conv: computes in fp32, cannot give {out_dtype}")
    y = x.new_empty(b, t, c, dtype=out_dtype)
    xfull = x.new_empty(b, w + t, c)
    if shift and t > MAX_BLOCK_T:
        raise ValueError(f"causal_conv: shift takes up to {MAX_BLOCK_T} rows, not {t}")
    if b * t * c == 0:
        if table is not None:
            raise ValueError("causal_conv: no rows for the sessions' windows")
        xfull.copy_(window)
        if shift and t:
            window.copy_(xfull[:, t:])
        return y, xfull
    block_t = min(MAX_BLOCK_T, triton.next_power_of_2(t))
    block_c = min(MAX_BLOCK_C, triton.next_power_of_2(c))
    grid = (triton.cdiv(c, block_c), triton.cdiv(t, block_t), b)
    _causal_conv_kernel[grid](
        x,
        window,
        weight,
        y,
        xfull,
        no_table(x.device) if table is None else table,
        int(table is not None),
        t,
        c,
        *x.stride(),
        *window.stride(),
        *weight.stride(),
        K=k,
        DIL=dilation,
        SILU=silu,
        BLOCK_T=block_t,
        BLOCK_C=block_c,
        BLOCK_W=triton.next_power_of_2(max(w, 1)),
        SHIFT=shift and w > 0,
        COLUMN=column,
        num_warps=4,
        enable_fp_fusion=False,
        **pdl(y.device),
    )
    return y, xfull


def conv_sessions(
    x: torch.Tensor,
    windows: list[torch.Tensor],
    weight: torch.Tensor,
    table: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """reference.conv_sessions in one launch: batch b reads session b's window where it lies
    (through `table`, session_tables.gdn_table of the sessions, made here when not given; a CUDA
    graph needs it made before its capture) and moves it past its rows in place: no
    stacked copy and no copy back. The same arithmetic as causal_conv."""
    if x.shape[1] == 0 or x.shape[2] == 0:
        return reference.conv_sessions(x, windows, weight)
    if table is None:  # the windows' offsets in the GDN table's conv column
        cols = GDN_CONV_COLUMN + 1
        table = offsets_table([windows] * cols, align=[1] * cols)
    return causal_conv(x, windows[0][None], weight, shift=True, table=table)
