"""The PLE layer's row-wise work in two launches (`reference.ngram_embed`, `reference.ple_gate`).

A lone step's PLE layer ran about 25 small kernels (the H200 timeline at cfeb84c): the n-gram
rows, torch's gather of their embeddings (11 us: its small-index kernel walks 16 random rows
of a 1 GB table one after another), two norms, a product with ones for the streams' sums, nine
elementwise ops and the conv's norm. Here:

* `ngram_embed`: one program a row hashes its n-gram rows (`triton.ngram_rows`, the ids
  `ngram_ids` stores) and gathers every head's embedding in one load: the same bits as the
  reference (a copy; an 8-bit table's rows scaled in the load, as the reference does).
* `ple_gate`: one program a (row, stream) norms the stream's key and query, sums their
  product in its own order (not the product with ones: other bits than before, the same in
  every path, each row its own), takes the signed square root and sigmoid, gates the value
  and norms the result for the conv. torch's rounding to the dtype after every op is kept;
  the division and square root are IEEE (`div_rn`, `sqrt_rn`) as torch's.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from flashlane.kernels.norms.triton import rms_factor
from flashlane.kernels.pdl import enter, pdl
from flashlane.kernels.rowwise.triton import ngram_rows, rounded, sigmoid


@triton.jit(do_not_specialize=["t", "stride"])
def _ngram_embed_kernel(
    hist_ptr,
    mult_ptr,
    size_ptr,
    off_ptr,
    table_ptr,
    scale_ptr,
    out_ptr,
    t,
    stride,
    eos,
    N: tl.constexpr,
    HEADS: tl.constexpr,
    HP2: tl.constexpr,
    D: tl.constexpr,
    DP2: tl.constexpr,
    SCALED: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    b = tl.program_id(0).to(tl.int64)
    row = tl.program_id(1).to(tl.int64)
    src = hist_ptr + b * stride + (N - 1) + row  # this row's id; the earlier ones before it
    heads = tl.arange(0, HP2)
    dims = tl.arange(0, DP2)
    mask = (heads < HEADS)[:, None] & (dims < D)[None, :]
    out = out_ptr + (b * t + row) * (N - 1) * HEADS * D
    mixed = tl.load(src) * tl.load(mult_ptr)
    broken = mixed != mixed  # False
    for s in tl.static_range(1, N):
        rows, mixed, broken = ngram_rows(
            src, mult_ptr, size_ptr, off_ptr, eos, mixed, broken, s, heads, HEADS
        )
        vals = tl.load(table_ptr + rows[:, None] * D + dims[None, :], mask=mask, other=0)
        if SCALED:  # an 8-bit table: q.float() * scale, rounded to the output's dtype once
            s_row = tl.load(scale_ptr + rows, mask=heads < HEADS, other=0.0)
            vals = (vals.to(tl.float32) * s_row[:, None]).to(out_ptr.dtype.element_ty)
        at = ((s - 1) * HEADS + heads)[:, None] * D + dims[None, :]
        tl.store(out + at, vals, mask=mask)


def ngram_embed(
    history,
    multipliers,
    sizes,
    offsets,
    n: int,
    heads: int,
    eos: int,
    table,
    scale=None,
    dtype=None,
):
    b, width = history.shape
    t = width - (n - 1)
    d = table.shape[1]
    hist = history if history.stride(-1) == 1 else history.contiguous()
    # a host table is read in place through mapped memory: never copied (host_tables.pinned)
    table = table.contiguous()
    out_dtype = table.dtype if scale is None else dtype
    out = torch.empty((b, t, (n - 1) * heads * d), dtype=out_dtype, device=history.device)
    if b and t:
        _ngram_embed_kernel[(b, t)](
            hist,
            multipliers,
            sizes,
            offsets,
            table,
            table if scale is None else scale,
            out,
            t,
            hist.stride(0),
            eos,
            N=n,
            HEADS=heads,
            HP2=triton.next_power_of_2(heads),
            D=d,
            DP2=triton.next_power_of_2(d),
            SCALED=scale is not None,
            num_warps=4,
            **pdl(out.device),
        )
    return out


@triton.jit
def _normed(ptr, w_ptr, c, cols, mask, eps, H: tl.constexpr, dt: tl.constexpr):
    """Stream c's H values at ptr through the grouped RMSNorm (the norms kernel's arithmetic),
    rounded to dt."""
    x = tl.load(ptr + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + c * H + cols, mask=mask, other=0.0).to(tl.float32)
    return rounded((x * rms_factor(x, H, eps)) * (1.0 + w), dt)


@triton.jit(do_not_specialize=["stride_k", "stride_r", "stride_v"])
def _ple_gate_kernel(
    k_ptr,
    r_ptr,
    v_ptr,
    wk_ptr,
    wq_ptr,
    wc_ptr,
    g_ptr,
    n_ptr,
    eps,
    root,
    stride_k,
    stride_r,
    stride_v,
    H: tl.constexpr,
    HC: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    dt: tl.constexpr = g_ptr.dtype.element_ty
    key = _normed(k_ptr + row * stride_k + c * H, wk_ptr, c, cols, mask, eps, H, dt)
    query = _normed(r_ptr + row * stride_r + c * H, wq_ptr, c, cols, mask, eps, H, dt)
    total = rounded(tl.sum(rounded(key * query, dt), axis=0), dt)
    gate = rounded(tl.math.div_rn(total, root), dt)
    size = rounded(tl.math.sqrt_rn(rounded(tl.maximum(tl.abs(gate), 1e-6), dt)), dt)
    sign = tl.where(gate > 0, 1.0, tl.where(gate < 0, -1.0, 0.0))
    scale = rounded(sigmoid(size * sign), dt)
    v = tl.load(v_ptr + row * stride_v + cols, mask=mask, other=0.0).to(tl.float32)
    gated = rounded(scale * v, dt)
    at = row * HC * H + c * H + cols
    tl.store(g_ptr + at, gated.to(dt), mask=mask)
    w = tl.load(wc_ptr + c * H + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(n_ptr + at, ((gated * rms_factor(gated, H, eps)) * (1.0 + w)).to(dt), mask=mask)


def ple_gate(key, r, value, w_key, w_query, w_conv, eps: float):
    n, h = value.shape
    hc = r.shape[1] // h
    key, r, value = (x if x.stride(-1) == 1 else x.contiguous() for x in (key, r, value))
    gated, normed = torch.empty_like(r), torch.empty_like(r)
    if n and h:
        block = triton.next_power_of_2(h)
        _ple_gate_kernel[(n, hc)](
            key,
            r,
            value,
            w_key,
            w_query,
            w_conv,
            gated,
            normed,
            eps,
            math.sqrt(h),
            key.stride(0),
            r.stride(0),
            value.stride(0),
            H=h,
            HC=hc,
            BLOCK=block,
            num_warps=max(1, min(16, block // 256)),
            **pdl(r.device),
        )
    return gated, normed


@triton.jit(do_not_specialize=["n"])
def _ple_add_kernel(r_ptr, g_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr, PDL: tl.constexpr = 0):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dt: tl.constexpr = out_ptr.dtype.element_ty
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, (r + rounded(g + y, dt)).to(dt), mask=mask)


def ple_add(r: torch.Tensor, gated: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """reference.ple_add in one launch (torch's two adds, each rounded to the dtype)."""
    r, gated, y = r.contiguous(), gated.contiguous(), y.contiguous()
    out = torch.empty_like(r)
    n = r.numel()
    if n:
        _ple_add_kernel[(triton.cdiv(n, 1024),)](r, gated, y, out, n, BLOCK=1024, **pdl(r.device))
    return out


@triton.jit
def _push_history_kernel(
    ids_ptr, tok_ptr, hist_ptr, CTX: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = 0
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    b = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    tok = tl.load(tok_ptr + b)
    old = tl.load(ids_ptr + b * CTX + cols, mask=cols < CTX, other=0)
    nxt = tl.load(ids_ptr + b * CTX + cols + 1, mask=cols + 1 < CTX, other=0)
    tl.store(hist_ptr + b * (CTX + 1) + cols, tl.where(cols == CTX, tok, old), mask=cols <= CTX)
    tl.debug_barrier()  # every old id read before any is overwritten
    tl.store(ids_ptr + b * CTX + cols, tl.where(cols + 1 == CTX, tok, nxt), mask=cols < CTX)


def push_history(ids: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    """reference.push_history in one launch (ids [B, ctx] contiguous, written in place)."""
    b, ctx = ids.shape
    hist = torch.empty((b, ctx + 1), dtype=ids.dtype, device=ids.device)
    if not ids.is_contiguous():
        raise ValueError("push_history: ids must be contiguous (they are written in place)")
    if b:
        _push_history_kernel[(b,)](
            ids,
            tok.contiguous(),
            hist,
            CTX=ctx,
            BLOCK=triton.next_power_of_2(ctx + 1),
            **pdl(ids.device),
        )
    return hist
