"""The hyper-connections' row-wise tails of `reference.py` in Triton (same signatures): the
down projection with the squash in its store, the mix, the write, and the write with the
next read's norm; the up projection with the mix in its tile is `triton_hc_up.py`'s. The
roundings and row invariance are `triton.py`'s.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.linear.triton import linear
from flashlane.kernels.norms.triton import rms_factor
from flashlane.kernels.pdl import enter, pdl
from flashlane.kernels.rowwise.triton import BLOCK, rounded, sigmoid


@triton.jit(do_not_specialize=["stride", "n"])
def _squash_kernel(
    d_ptr, y_ptr, stride, n, HC: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = 0
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    dt: tl.constexpr = y_ptr.dtype.element_ty
    x = rounded(tl.load(d_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32) / HC, dt)
    tl.store(y_ptr + row * n + cols, (x / (1.0 + tl.exp(-x))).to(dt), mask=mask)


def hc_down(xn: torch.Tensor, w: torch.Tensor, lowrank: int, hc: int) -> torch.Tensor:
    """One launch: the linear kernel squashes the first `lowrank` columns as it stores them
    (same bits as linear then hc_squash). Squashing in the up projection's loads instead
    cost 5 us a call on the H200 (benchmarks/cold_linears.py)."""
    return linear(xn, w, squash=(lowrank, hc))


def hc_squash(d: torch.Tensor, hc: int) -> torch.Tensor:
    """The squash alone (hc_down squashes in the linear's stores; tests hold the two
    equal)."""
    m, n = d.shape
    y = torch.empty((m, n), dtype=d.dtype, device=d.device)
    if m and n:
        _squash_kernel[(m, triton.cdiv(n, BLOCK))](
            d, y, d.stride(0), n, HC=hc, BLOCK=BLOCK, **pdl(d.device)
        )
    return y


@triton.jit
def stream_mixed(u, xn_ptr, offs, mask, dt: tl.constexpr):
    """One stream's sigmoid(u) * xn from its fp32 mix logits u (rounded to dt first, as the
    up projection stores them), each op rounded to dt."""
    xn = tl.load(xn_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    return rounded(rounded(sigmoid(rounded(u, dt)), dt) * xn, dt)


@triton.jit
def _mixed(u_ptr, xn_ptr, offs, mask, dt: tl.constexpr):
    """One stream's sigmoid(u) * xn from the stored mix logits."""
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    return stream_mixed(u, xn_ptr, offs, mask, dt)


@triton.jit
def write_weights(inj, HC: tl.constexpr, dt: tl.constexpr):
    """The write weights 2 sigmoid(inject / hc) of the inject columns, each op rounded."""
    s = rounded(sigmoid(rounded(inj.to(tl.float32) / HC, dt)), dt)
    return (2.0 * s).to(dt)


@triton.jit(do_not_specialize=["h", "stride_inj"])
def _hc_mix_kernel(
    u_ptr,
    xn_ptr,
    inj_ptr,
    a_ptr,
    w_ptr,
    h,
    stride_inj,
    HC: tl.constexpr,
    HC_P2: tl.constexpr,
    INJECT: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < h
    dt: tl.constexpr = a_ptr.dtype.element_ty
    base = row * HC * h + cols
    total = _mixed(u_ptr, xn_ptr, base, mask, dt)
    for c in tl.static_range(1, HC):
        total = rounded(total + _mixed(u_ptr, xn_ptr, base + c * h, mask, dt), dt)
    tl.store(a_ptr + row * h + cols, (total / HC).to(dt), mask=mask)
    # a constexpr and a runtime test in one `and` would not fold the constexpr away
    if INJECT:  # noqa: SIM102
        if tl.program_id(1) == 0:
            ch = tl.arange(0, HC_P2)
            inj = tl.load(inj_ptr + row * stride_inj + ch, mask=ch < HC, other=0.0)
            tl.store(w_ptr + row * HC + ch, write_weights(inj, HC, dt), mask=ch < HC)


def hc_mix(u: torch.Tensor, xn: torch.Tensor, inject: torch.Tensor | None, hc: int):
    m = u.shape[0]
    h = u.shape[1] // hc
    u, xn = u.contiguous(), xn.contiguous()
    a = torch.empty((m, h), dtype=u.dtype, device=u.device)
    w = None if inject is None else torch.empty((m, hc), dtype=u.dtype, device=u.device)
    if m and h:
        _hc_mix_kernel[(m, triton.cdiv(h, BLOCK))](
            u,
            xn,
            a if inject is None else inject,
            a,
            a if w is None else w,
            h,
            0 if inject is None else inject.stride(0),
            HC=hc,
            HC_P2=triton.next_power_of_2(hc),
            INJECT=inject is not None,
            BLOCK=BLOCK,
            **pdl(u.device),
        )
    return a, w


@triton.jit(do_not_specialize=["h"])
def _hc_write_kernel(
    r_ptr, y_ptr, w_ptr, out_ptr, h, HC: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = 0
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < HC * h
    dt: tl.constexpr = out_ptr.dtype.element_ty
    y = tl.load(y_ptr + row * h + cols % h, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + row * HC + cols // h, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + row * HC * h + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * HC * h + cols, (r + rounded(y * w, dt)).to(dt), mask=mask)


def hc_write(r: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    m, hc = w.shape
    r, y, w = r.contiguous(), y.contiguous(), w.contiguous()
    out = torch.empty_like(r)
    if m and r.shape[1]:
        grid = (m, triton.cdiv(r.shape[1], BLOCK))
        _hc_write_kernel[grid](r, y, w, out, y.shape[1], HC=hc, BLOCK=BLOCK, **pdl(r.device))
    return out


@triton.jit(do_not_specialize=["eps", "per"])
def _hc_write_norm_kernel(
    r_ptr,
    y_ptr,
    w_ptr,
    nw_ptr,
    out_ptr,
    xn_ptr,
    idx_ptr,
    eps,
    per,
    H: tl.constexpr,
    HC: tl.constexpr,
    BLOCK: tl.constexpr,
    PICK: tl.constexpr = 0,
    PDL: tl.constexpr = 0,
):
    # PICK: the norm of row i is stored only where the run of `per` rows it belongs to picks
    # it (idx[i // per] is i), into xn's row i // per
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)  # one stream: the norm's group
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    dt: tl.constexpr = out_ptr.dtype.element_ty
    at = row * HC * H + c * H + cols
    y = tl.load(y_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + row * HC + c).to(tl.float32)
    x = rounded(tl.load(r_ptr + at, mask=mask, other=0.0).to(tl.float32) + rounded(y * w, dt), dt)
    tl.store(out_ptr + at, x.to(dt), mask=mask)
    # the norms kernel's arithmetic on the written values
    rs = rms_factor(x, H, eps)
    nw = tl.load(nw_ptr + c * H + cols, mask=mask, other=0.0).to(tl.float32)
    xn = ((x * rs) * (1.0 + nw)).to(dt)
    if PICK:
        run = row // per
        picked = tl.load(idx_ptr + run) == row
        tl.store(xn_ptr + run * HC * H + c * H + cols, xn, mask=mask & picked)
    else:
        tl.store(xn_ptr + at, xn, mask=mask)


def hc_write_norm(r, y, w, weight, eps: float, rows: torch.Tensor | None = None):
    """reference.hc_write_norm in one launch. rows [B]: the norm of the written rows
    rows[b] alone, [B, hc*H], each pick in its own run of N / B rows (a drafted step's last
    kept row of each session's window), read nowhere else."""
    m, hc = w.shape
    h = y.shape[1]
    r, y, w = r.contiguous(), y.contiguous(), w.contiguous()
    out = torch.empty_like(r)
    if rows is None:
        xn, per = torch.empty_like(r), 1
    else:
        b = rows.shape[0]
        if b == 0 or m % b or not rows.is_contiguous():
            raise ValueError(f"hc_write_norm: rows [B] contiguous, B dividing {m}")
        xn, per = torch.empty((b, r.shape[1]), dtype=r.dtype, device=r.device), m // b
    if m and h:
        block = triton.next_power_of_2(h)
        _hc_write_norm_kernel[(m, hc)](
            r,
            y,
            w,
            weight.contiguous(),
            out,
            xn,
            xn if rows is None else rows,
            eps,
            per,
            H=h,
            HC=hc,
            BLOCK=block,
            PICK=rows is not None,
            num_warps=max(1, min(16, block // 256)),
            **pdl(r.device),
        )
    return out, xn
