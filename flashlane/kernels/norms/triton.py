"""Row-invariant Triton norms, same signatures as `reference.py` (and `l2norm` of the GDN layer).

One program per row (per group for a grouped RMSNorm; a fixed count of rows for the GDN's
gated norm); the whole row is one fixed block (the next power of two of its width), so a
row's sum of squares is reduced in the same order whatever the number of rows. Computes in
fp32 and returns x's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.pdl import enter, pdl


@triton.jit
def rms_factor(x, n, eps, AXIS: tl.constexpr = 0):
    """rsqrt(mean(x^2) + eps) of fp32 x over its n values along AXIS: the scale every Triton
    RMSNorm here applies (these kernels, the hyper-connections' write_norm, the indexer's
    block keys), so fused and separate norms do the same arithmetic."""
    return tl.rsqrt(tl.sum(x * x, axis=AXIS) / n + eps)


@triton.jit
def l2_factor(x, eps):
    """rsqrt(sum(x^2) + eps) of fp32 x: the L2 norm's scale (l2norm, the GDN's q and k)."""
    return tl.rsqrt(tl.sum(x * x, axis=0) + eps)


# the gated norm's rows a program: 2048 values' worth (the GDN's rows of 128, one a head: 16
# on 4 warps; an 8k-token prefill is 393k rows, and one a program took 473 us a layer on the
# H200). A function of the width alone, never of the row count.
_GATED_VALUES = 2048


def _gated_rows(block: int) -> tuple[int, int]:
    """(rows a program, warps) for rows of `block` values."""
    rows = max(1, _GATED_VALUES // block)
    return rows, (4 if rows > 1 else _warps(block))


def _warps(block: int) -> int:
    return max(1, min(16, block // 256))


@triton.jit(do_not_specialize=["rows", "stride_x"])
def _rms_norm_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    idx_ptr,
    rows,
    eps,
    stride_x,
    keep_ptr,
    per,
    D: tl.constexpr,
    G: tl.constexpr,
    BLOCK: tl.constexpr,
    GATHER: tl.constexpr = 0,
    KEEP: tl.constexpr = 0,
    PDL: tl.constexpr = 0,
):
    # program = one (row, group) of G values; the weight is indexed across the whole row D;
    # x's rows of D values lie stride_x apart (y's are contiguous); GATHER: y's row i is
    # x's row idx[i]; KEEP: row i is also stored as it is into keep's row i // per when
    # idx[i // per] is i (the run of `per` rows it belongs to picks it)
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < G
    groups: tl.constexpr = D // G
    wcols = (pid % groups) * G + cols
    row = tl.load(idx_ptr + pid // groups) if GATHER else pid // groups
    x = tl.load(x_ptr + row * stride_x + wcols, mask=mask, other=0.0).to(tl.float32)
    if KEEP:
        run = row // per
        picked = tl.load(idx_ptr + run) == row
        tl.store(keep_ptr + run * D + wcols, x.to(keep_ptr.dtype.element_ty), mask=mask & picked)
    r = rms_factor(x, G, eps)
    w = tl.load(w_ptr + wcols, mask=mask, other=0.0).to(tl.float32)
    y = (x * r) * (1.0 + w)
    tl.store(y_ptr + pid * G + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    group: int | None = None,
    rows: torch.Tensor | None = None,
    keep: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Zero-centred RMSNorm `x * rsqrt(mean(x^2) + eps) * (1 + w)` over the last dim,
    per run of `group` values when given. x: [..., D]; weight: [D]. rows: [M] indices into
    x [N, D]: the norm of x[rows] [M, D], the rows read where they lie (no gathered copy).
    keep: (picks [B], out [B, D]): out[b] = x[picks[b]] in the same launch, each pick in its
    own run of N / B rows (a drafted step's last kept row of each session's window)."""
    d = x.shape[-1]
    g = d if group is None else group
    if d % g:
        raise ValueError(f"rms_norm: width {d} is not a multiple of group {g}")
    if (rows is not None or keep is not None) and x.dim() != 2:
        raise ValueError(f"rms_norm: rows index an [N, D] x, not {tuple(x.shape)}")
    per = _keep_run(x, keep, rows)
    xc = rows_view(x, d)  # a view where x's rows are evenly spaced (a column slice): no copy
    shape = x.shape if rows is None else (rows.shape[0], d)
    y = torch.empty(shape, dtype=x.dtype, device=x.device)
    programs = y.numel() // g
    if programs:
        block = triton.next_power_of_2(g)
        _rms_norm_kernel[(programs,)](
            xc,
            weight.contiguous(),
            y,
            y if rows is None and keep is None else (rows if keep is None else keep[0]),
            programs,
            eps,
            xc.stride(0),
            y if keep is None else keep[1],
            per,
            D=d,
            G=g,
            BLOCK=block,
            GATHER=rows is not None,
            KEEP=keep is not None,
            num_warps=_warps(block),
            **pdl(xc.device),
        )
    return y


def _keep_run(x: torch.Tensor, keep, rows) -> int:
    """The rows of x a keep's pick is taken from (1 without keep); checks keep's shapes."""
    if keep is None:
        return 1
    picks, out = keep
    n, b = x.shape[0], picks.shape[0]
    if rows is not None or b == 0 or n % b or out.shape != (b, x.shape[1]):
        raise ValueError(f"rms_norm: keep needs [B] picks and [B, D] out, B dividing {n}")
    if not out.is_contiguous():
        raise ValueError("rms_norm: keep's out must be contiguous")
    return n // b


def rows_view(x: torch.Tensor, d: int) -> torch.Tensor:
    """x as [rows, d] with unit column stride: a view where its rows are evenly spaced (the
    attention's queries, a column slice of the projection; the GDN's v, a and b), else a
    contiguous copy. A kernel then reads row i at rows_view(x, d).stride(0) * i."""
    if x.stride(-1) == 1:
        try:
            return x.view(-1, d)
        except RuntimeError:  # rows not evenly spaced
            pass
    return x.reshape(-1, d).contiguous()


@triton.jit(do_not_specialize=["rows", "per", "stride_g"])
def _gated_rms_norm_kernel(
    x_ptr,
    gate_ptr,
    w_ptr,
    y_ptr,
    rows,
    eps,
    per,
    stride_g,
    D: tl.constexpr,
    SIGMOID: tl.constexpr,
    ROUND_PROD: tl.constexpr,
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    # ROWS rows a program (a fixed count: each row's sums are its own, whatever the grid)
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (row < rows)[:, None] & (cols < D)[None, :]
    dt = y_ptr.dtype.element_ty
    x = tl.load(x_ptr + row[:, None] * D + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    r = rms_factor(x, D, eps, 1)  # row by row
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.0)
    # as the reference: the normalised row back in x's dtype, times w in the promoted dtype
    # (x's dtype when w has it: the product is rounded to it; else fp32)
    h = (x * r[:, None]).to(dt).to(tl.float32) * w.to(tl.float32)[None, :]
    if ROUND_PROD:
        h = h.to(dt).to(tl.float32)
    # gate row i: row i % per of its group i // per, groups stride_g apart
    g_row = (row // per) * stride_g + (row % per) * D
    g = tl.load(gate_ptr + g_row[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if SIGMOID:
        act = 1.0 / (1.0 + tl.exp(-g))
    else:
        act = g / (1.0 + tl.exp(-g))
    tl.store(y_ptr + row[:, None] * D + cols[None, :], (h * act).to(dt), mask=mask)


def _gate_rows(gate: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """(gate, per, stride_g): the gate's rows of D contiguous in groups of `per` rows,
    groups stride_g apart, read where they lie: the GDN's output gate [N, HV, Dv] is a
    column slice of the input projection, so a batch of N > 1 rows is strided. Else a
    contiguous copy, read as one group."""
    d = gate.shape[-1]
    if gate.dim() == 2 and gate.stride(-1) == 1:  # rows of D, evenly strided
        return gate, 1, gate.stride(0)
    if gate.dim() > 2 and gate.stride(-1) == 1 and gate.stride(-2) == d:
        lead = gate.shape[:-2]
        per = gate.shape[-2]
        try:
            groups = gate.view(-1, per * d) if lead else gate.view(1, per * d)
        except RuntimeError:
            groups = None
        if groups is not None and groups.stride(-1) == 1:
            return gate, per, groups.stride(0)
    gc = gate.contiguous()
    return gc, max(1, gc.numel() // max(d, 1)), 0


def gated_rms_norm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float, activation: str
) -> torch.Tensor:
    """The GDN output norm: plain RMSNorm (weight `w`, not `1 + w`) times act(gate).

    x, gate: [..., Dv]; weight: [Dv]; activation "sigmoid" | "silu".
    """
    if activation not in ("sigmoid", "silu"):
        raise ValueError(f"gated_rms_norm: unknown activation {activation!r}")
    d = x.shape[-1]
    xc = x.contiguous()
    gc, per, stride_g = _gate_rows(gate)
    y = torch.empty_like(xc)
    rows = xc.numel() // d if d else 0
    if rows:
        block = triton.next_power_of_2(d)
        round_prod = torch.promote_types(weight.dtype, x.dtype) == x.dtype
        per_program, warps = _gated_rows(block)
        _gated_rms_norm_kernel[(triton.cdiv(rows, per_program),)](
            xc,
            gc,
            weight.contiguous(),
            y,
            rows,
            eps,
            per,
            stride_g,
            D=d,
            SIGMOID=activation == "sigmoid",
            ROUND_PROD=round_prod,
            BLOCK=block,
            ROWS=per_program,
            num_warps=warps,
            **pdl(xc.device),
        )
    return y


@triton.jit(do_not_specialize=["rows"])
def _l2norm_kernel(
    x_ptr, y_ptr, rows, eps, D: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = 0
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    x = tl.load(x_ptr + pid * D + cols, mask=mask, other=0.0).to(tl.float32)
    r = l2_factor(x, eps)
    tl.store(y_ptr + pid * D + cols, (x * r).to(y_ptr.dtype.element_ty), mask=mask)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x * rsqrt(sum(x * x, -1) + eps), computed in fp32, returned in x's dtype."""
    d = x.shape[-1]
    xc = x.contiguous()
    y = torch.empty_like(xc)
    rows = xc.numel() // d if d else 0
    if rows:
        block = triton.next_power_of_2(d)
        _l2norm_kernel[(rows,)](
            xc, y, rows, eps, D=d, BLOCK=block, num_warps=_warps(block), **pdl(xc.device)
        )
    return y
