"""The row-wise tails of `reference.py`, one Triton launch each (same signatures); the
hyper-connections' are in `triton_hc.py` and `triton_hc_up.py`, the rotary embedding's in
`triton_rope.py`.

A decode step of Flash Next ran about 20 small torch kernels per hyper-connection read, 2 per
write, 7 for the GDN gates and 3 for the shared expert's SwiGLU; in a CUDA graph each costs a
launch slot of 1-3 us, more than the work. Each kernel here computes in fp32 and rounds to
the output dtype after every op where torch does (the reference's ops on bf16 tensors), so
the values follow the reference up to the last bit of exp; a program reads one row's values
and writes that row, so no row depends on another (row invariance).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.norms.triton import l2_factor
from flashlane.kernels.pdl import enter, pdl

BLOCK = 1024


@triton.jit
def rounded(x, dt: tl.constexpr):
    """x rounded to the output dtype, back in fp32 (what a torch op on dt tensors keeps)."""
    return x.to(dt).to(tl.float32)


@triton.jit
def sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def gdn_gate_values(a, b, a_log, dt_bias, dt: tl.constexpr):
    """The GDN's gates from a, b, A_log, dt_bias (fp32, per head or a row's vector): (log
    decay g = -exp(A_log) softplus(a + dt_bias) in fp32, beta = sigmoid(b) in dt, b's
    dtype). The one copy of this arithmetic: _gdn_gates_kernel and the recurrent GDN kernel
    (kernels/gdn/triton.py) both call it, so their g and beta have the same bits."""
    x = a + dt_bias
    softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))
    decay = tl.exp(a_log)
    return -decay * softplus, sigmoid(b).to(dt)


@triton.jit(do_not_specialize=["stride_a", "stride_b"])
def _gdn_gates_kernel(
    a_ptr,
    b_ptr,
    alog_ptr,
    dtb_ptr,
    g_ptr,
    beta_ptr,
    stride_a,
    stride_b,
    HV: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < HV
    a = tl.load(a_ptr + row * stride_a + cols, mask=mask, other=0.0).to(tl.float32)
    dt_bias = tl.load(dtb_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    a_log = tl.load(alog_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + row * stride_b + cols, mask=mask, other=0.0).to(tl.float32)
    g, beta = gdn_gate_values(a, b, a_log, dt_bias, beta_ptr.dtype.element_ty)
    tl.store(g_ptr + row * HV + cols, g, mask=mask)
    tl.store(beta_ptr + row * HV + cols, beta, mask=mask)


def gdn_gates(a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor):
    m, hv = a.shape
    g = torch.empty((m, hv), dtype=torch.promote_types(a.dtype, torch.float32), device=a.device)
    beta = torch.empty((m, hv), dtype=b.dtype, device=b.device)
    if m and hv:
        _gdn_gates_kernel[(m,)](
            a,
            b,
            a_log.contiguous(),
            dt_bias.contiguous(),
            g,
            beta,
            a.stride(0),
            b.stride(0),
            HV=hv,
            BLOCK=triton.next_power_of_2(hv),
            **pdl(a.device),
        )
    return g, beta


@triton.jit
def _l2(x, dt: tl.constexpr):
    """x * rsqrt(sum(x^2) + 1e-6), kernels/norms l2norm's arithmetic, rounded to dt."""
    return rounded(x * l2_factor(x, 1e-6), dt)


@triton.jit(do_not_specialize=["stride"])
def _gdn_qk_kernel(
    y_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    stride,
    scale,
    HEADS: tl.constexpr,
    DIM: tl.constexpr,
    REP: tl.constexpr,
    BLOCK: tl.constexpr,
    WITH_V: tl.constexpr = False,
    PDL: tl.constexpr = 0,
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    mask = cols < DIM
    dt: tl.constexpr = q_ptr.dtype.element_ty
    src = y_ptr + row * stride + head * DIM + cols
    q = rounded(_l2(tl.load(src, mask=mask, other=0.0).to(tl.float32), dt) * scale, dt)
    k = _l2(tl.load(src + HEADS * DIM, mask=mask, other=0.0).to(tl.float32), dt)
    out = (row * HEADS * REP + head * REP) * DIM + cols
    for j in tl.static_range(REP):
        tl.store(q_ptr + out + j * DIM, q.to(dt), mask=mask)
        tl.store(k_ptr + out + j * DIM, k.to(dt), mask=mask)
    if WITH_V:  # this key head's value heads, copied where the chunked rule reads them
        for j in tl.static_range(REP):
            v = tl.load(src + (2 * HEADS + head * (REP - 1) + j) * DIM, mask=mask)
            tl.store(v_ptr + out + j * DIM, v, mask=mask)


def gdn_qk(y: torch.Tensor, heads: int, dim: int, rep: int, scale: float, with_v: bool = False):
    """rowwise.reference.gdn_qk in one launch (with_v: the value heads' copy in the same
    launch, instead of a strided copy of its own: 118 us a layer at 8k rows on the H200)."""
    lead = y.shape[:-1]
    y2 = y.reshape(-1, y.shape[-1])
    if y2.stride(-1) != 1:
        y2 = y2.contiguous()
    m = y2.shape[0]
    q = torch.empty((*lead, heads * rep, dim), dtype=y.dtype, device=y.device)
    k = torch.empty_like(q)
    v = torch.empty_like(q) if with_v else q
    if m:
        _gdn_qk_kernel[(m, heads)](
            y2,
            q,
            k,
            v,
            y2.stride(0),
            scale,
            HEADS=heads,
            DIM=dim,
            REP=rep,
            BLOCK=triton.next_power_of_2(dim),
            WITH_V=with_v,
            **pdl(y2.device),
        )
    return (q, k, v) if with_v else (q, k)


@triton.jit(do_not_specialize=["t", "stride"])
def _ngram_kernel(
    hist_ptr,
    mult_ptr,
    size_ptr,
    off_ptr,
    out_ptr,
    t,
    stride,
    eos,
    N: tl.constexpr,
    HEADS: tl.constexpr,
    HP2: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    b = tl.program_id(0).to(tl.int64)
    row = tl.program_id(1).to(tl.int64)
    src = hist_ptr + b * stride + (N - 1) + row  # this row's id; the earlier ones before it
    heads = tl.arange(0, HP2)
    hmask = heads < HEADS
    out = out_ptr + (b * t + row) * (N - 1) * HEADS
    mixed = tl.load(src) * tl.load(mult_ptr)
    broken = mixed != mixed  # False
    for s in tl.static_range(1, N):
        rows, mixed, broken = ngram_rows(
            src, mult_ptr, size_ptr, off_ptr, eos, mixed, broken, s, heads, HEADS
        )
        tl.store(out + (s - 1) * HEADS + heads, rows, mask=hmask)


@triton.jit
def ngram_rows(
    src,
    mult_ptr,
    size_ptr,
    off_ptr,
    eos,
    mixed,
    broken,
    s: tl.constexpr,
    heads,
    HEADS: tl.constexpr,
):
    """Order s+1's table rows of the row at src (its heads'; a padded head reads row 0), and
    the hash and EOS flag carried to the next order."""
    hmask = heads < HEADS
    prev = tl.load(src - s)
    mixed = mixed ^ (tl.where(broken, eos, prev) * tl.load(mult_ptr + s))
    broken = broken | (prev == eos)
    size = tl.load(size_ptr + (s - 1) * HEADS + heads, mask=hmask, other=1)
    rem = mixed % size
    rem = tl.where(rem < 0, rem + size, rem)  # torch.remainder: the divisor's sign
    off = tl.load(off_ptr + (s - 1) * HEADS + heads, mask=hmask, other=0)
    return tl.where(hmask, rem + off, 0), mixed, broken


def ngram_ids(history, multipliers, sizes, offsets, n: int, heads: int, eos: int):
    b, width = history.shape
    t = width - (n - 1)
    hist = history if history.stride(-1) == 1 else history.contiguous()
    out = torch.empty((b, t, (n - 1) * heads), dtype=torch.long, device=history.device)
    if b and t:
        _ngram_kernel[(b, t)](
            hist,
            multipliers,
            sizes,
            offsets,
            out,
            t,
            hist.stride(0),
            eos,
            N=n,
            HEADS=heads,
            HP2=triton.next_power_of_2(heads),
            **pdl(out.device),
        )
    return out


@triton.jit(do_not_specialize=["heads", "stride_n", "stride_h"])
def _gated_heads_kernel(
    o_ptr,
    g_ptr,
    y_ptr,
    heads,
    stride_n,
    stride_h,
    D: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    dt: tl.constexpr = y_ptr.dtype.element_ty
    at = (row * heads + head) * D + cols
    o = tl.load(o_ptr + at, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + row * stride_n + head * stride_h + cols, mask=mask, other=0.0)
    tl.store(y_ptr + at, (o * rounded(sigmoid(g.to(tl.float32)), dt)).to(dt), mask=mask)


def gated_heads(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    n, heads, d = o.shape
    o = o.contiguous()
    if gate.stride(-1) != 1:
        gate = gate.contiguous()
    y = torch.empty((n, heads * d), dtype=o.dtype, device=o.device)
    if n and heads:
        _gated_heads_kernel[(n, heads)](
            o, gate, y, heads, gate.stride(0), gate.stride(1), D=d,
            BLOCK=triton.next_power_of_2(d), **pdl(y.device),
        )  # fmt: skip
    return y


@triton.jit(do_not_specialize=["n", "stride_g", "stride_u"])
def _swiglu_kernel(
    g_ptr, u_ptr, y_ptr, n, stride_g, stride_u, BLOCK: tl.constexpr, PDL: tl.constexpr = 0
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    dt: tl.constexpr = y_ptr.dtype.element_ty
    g = tl.load(g_ptr + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * n + cols, (rounded(g / (1.0 + tl.exp(-g)), dt) * u).to(dt), mask=mask)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    m, n = gate.shape
    y = torch.empty((m, n), dtype=gate.dtype, device=gate.device)
    if m and n:
        _swiglu_kernel[(m, triton.cdiv(n, BLOCK))](
            gate, up, y, n, gate.stride(0), up.stride(0), BLOCK=BLOCK, **pdl(y.device)
        )
    return y
